//! A throwaway PostgreSQL cluster for tests: `initdb` in a temp dir, a server on its own unix
//! socket and a free 127.0.0.1 port, a fresh database per test.
//!
//! Std only, so both the library's unit tests (`#[path]`-included by `store::postgres`) and
//! the integration test binary can use it. One cluster per test binary ([`shared`]); tests
//! that restart or stop the server start their own ([`PgCluster::start`]). Each test gets a
//! fresh schema of the database `hw_test`, named in its URL's `search_path`: as isolated as
//! a database for highwater's tables, and free, where `CREATE DATABASE` takes 0.4-0.9 s
//! here (a checkpoint).
//!
//! Cleanup does not depend on the test process ending well: each cluster has a watchdog
//! (`sh`) that waits for EOF on a pipe only this process holds, then stops the server and
//! removes the directory. A panic, a normal exit and a SIGKILL all close the pipe.
//!
//! The server binaries are looked up in `$HIGHWATER_PG_BIN`, then
//! `/usr/lib/postgresql/15/bin`, then the newest `/usr/lib/postgresql/*/bin`. Missing
//! binaries fail the test with a message saying how to install them, whether or not CI is
//! set: a test that needs PostgreSQL never passes without it. `initdb` refuses to run as
//! root, so as root every server command runs as the `postgres` user (`runuser`), in a
//! directory chowned to it.
//!
//! Authentication: the unix socket trusts everyone (connect as `postgres`); TCP on
//! 127.0.0.1 asks for a SCRAM password, so tests can check how passwords are handled.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

/// A running test cluster. Dropping it stops the server and removes its directory.
pub struct PgCluster {
    bin: PathBuf,
    /// The cluster's directory: `data/`, the socket, the server log.
    dir: PathBuf,
    port: u16,
    as_postgres: bool,
    /// The CA that signed the server's certificate, if it serves TLS.
    ca: Option<PathBuf>,
    watchdog: Mutex<Option<(Child, ChildStdin)>>,
}

/// The database the tests' schemas live in.
pub const TEST_DATABASE: &str = "hw_test";

/// A fresh, empty schema of [`TEST_DATABASE`], for one test.
#[derive(Debug, Clone)]
pub struct TestDb {
    /// The database's name.
    pub name: String,
    /// The test's own schema.
    pub schema: String,
    /// Unix-socket URL, user `postgres`, no password, `search_path` the test's schema.
    pub url: String,
    socket_dir: PathBuf,
    port: u16,
}

impl TestDb {
    /// A TCP URL on 127.0.0.1 for `user` (no password in it, `search_path` the schema).
    pub fn tcp_url(&self, user: &str) -> String {
        format!(
            "postgresql://{user}@127.0.0.1:{}/{}?options=-c%20search_path%3D{}",
            self.port, self.name, self.schema
        )
    }

    /// The directory of the server's unix socket.
    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

/// The cluster shared by every test of this binary, started on first use.
pub fn shared() -> &'static PgCluster {
    static SHARED: OnceLock<PgCluster> = OnceLock::new();
    SHARED.get_or_init(PgCluster::start)
}

/// A fresh database in the shared cluster.
pub fn fresh_db() -> TestDb {
    shared().create_db()
}

impl PgCluster {
    /// initdb and start a new cluster. Panics with a clear message if PostgreSQL's server
    /// binaries are missing or the server does not start.
    pub fn start() -> PgCluster {
        Self::start_with(false)
    }

    /// A cluster that also serves TLS, with a certificate for `localhost` (only) signed by a
    /// throwaway CA ([`PgCluster::ca_pem`]). Needs the `openssl` command.
    pub fn start_tls() -> PgCluster {
        Self::start_with(true)
    }

    fn start_with(tls: bool) -> PgCluster {
        let bin = server_bin();
        // SAFETY: geteuid has no preconditions.
        let as_postgres = unsafe { libc::geteuid() } == 0;
        let dir = tempfile::Builder::new()
            .prefix("hw-pg-")
            .tempdir()
            .expect("create the test cluster's temp dir")
            .keep();
        if as_postgres {
            chown_to_postgres(&dir);
        }
        let mut cluster = PgCluster {
            bin,
            dir,
            port: 0,
            as_postgres,
            ca: None,
            watchdog: Mutex::new(None),
        };
        cluster.start_watchdog();
        cluster.initdb();
        if tls {
            cluster.ca = Some(cluster.make_certificates());
        }
        // A free port can be taken by someone else between our probe and the server's bind:
        // try a few.
        let mut last_error = String::new();
        for _ in 0..5 {
            cluster.port = free_port();
            match cluster.pg_ctl_start() {
                Ok(()) => {
                    cluster.psql("postgres", &format!("CREATE DATABASE {TEST_DATABASE}"));
                    return cluster;
                }
                Err(e) => last_error = e,
            }
        }
        panic!("the test PostgreSQL server did not start: {last_error}");
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    pub fn log(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    /// The PEM file of the CA that signed the server's certificate (TLS clusters only).
    pub fn ca_pem(&self) -> Option<&Path> {
        self.ca.as_deref()
    }

    /// A CA and a server certificate for DNS name `localhost`, installed in the data
    /// directory with `ssl = on`. Returns the CA's PEM file.
    fn make_certificates(&self) -> PathBuf {
        let data = self.data();
        let ca_key = self.dir.join("ca.key");
        let ca = self.dir.join("ca.pem");
        let csr = self.dir.join("server.csr");
        let ext = self.dir.join("server.ext");
        std::fs::write(
            &ext,
            "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
        )
        .expect("write the certificate extensions");
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let openssl = |args: &[&std::ffi::OsStr]| {
            let out = Command::new("openssl")
                .args(args)
                .output()
                .expect("run openssl (the TLS test needs the openssl command)");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let os = |s: &'static str| std::ffi::OsStr::new(s);
        let mut args: Vec<&std::ffi::OsStr> = vec![os("req"), os("-x509")];
        args.extend(ec.iter().map(|a| os(a)));
        args.extend([
            os("-keyout"),
            ca_key.as_os_str(),
            os("-out"),
            ca.as_os_str(),
            os("-days"),
            os("2"),
            os("-subj"),
            os("/CN=highwater test CA"),
            os("-addext"),
            os("basicConstraints=critical,CA:TRUE"),
            os("-addext"),
            os("keyUsage=critical,keyCertSign,cRLSign"),
        ]);
        openssl(&args);
        let key = data.join("server.key");
        let crt = data.join("server.crt");
        let mut args: Vec<&std::ffi::OsStr> = vec![os("req")];
        args.extend(ec.iter().map(|a| os(a)));
        args.extend([
            os("-keyout"),
            key.as_os_str(),
            os("-out"),
            csr.as_os_str(),
            os("-subj"),
            os("/CN=localhost"),
        ]);
        openssl(&args);
        openssl(&[
            os("x509"),
            os("-req"),
            os("-in"),
            csr.as_os_str(),
            os("-CA"),
            ca.as_os_str(),
            os("-CAkey"),
            ca_key.as_os_str(),
            os("-CAcreateserial"),
            os("-out"),
            crt.as_os_str(),
            os("-days"),
            os("2"),
            os("-extfile"),
            ext.as_os_str(),
        ]);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))
            .expect("chmod server.key");
        if self.as_postgres {
            for f in [&key, &crt] {
                chown_to_postgres(f);
            }
        }
        let mut conf = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .expect("open postgresql.conf");
        conf.write_all(b"ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n")
            .expect("append to postgresql.conf");
        ca
    }

    /// The directory holding the server's unix socket.
    pub fn socket_dir(&self) -> &Path {
        &self.dir
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// A command for a server binary, as the `postgres` user when we are root.
    fn server_command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }

    fn initdb(&self) {
        let out = self
            .server_command("initdb")
            .arg("-D")
            .arg(self.data())
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"])
            .arg("--locale=C")
            .output()
            .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Socket: trust. TCP on loopback: SCRAM passwords (tests of password handling).
        let hba = "local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n";
        std::fs::write(self.data().join("pg_hba.conf"), hba).expect("write pg_hba.conf");
        let conf = "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n\
                    max_connections = 200\nshared_buffers = 32MB\n";
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.data().join("postgresql.conf"))
            .expect("open postgresql.conf");
        f.write_all(conf.as_bytes())
            .expect("append to postgresql.conf");
    }

    fn pg_ctl_start(&self) -> Result<(), String> {
        let options = format!(
            "-k {} -c listen_addresses=127.0.0.1 -p {}",
            self.dir.display(),
            self.port
        );
        let out = self
            .server_command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.log())
            .args(["-w", "-t", "60", "-o", &options, "start"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .output()
            .expect("run pg_ctl start");
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{}\nserver log:\n{}",
                String::from_utf8_lossy(&out.stderr),
                std::fs::read_to_string(self.log()).unwrap_or_default()
            ))
        }
    }

    /// Stop the server (fast shutdown) and start it again on the same port.
    pub fn restart(&self) {
        let out = self
            .server_command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-w", "-m", "fast", "stop"])
            .output()
            .expect("run pg_ctl stop");
        assert!(out.status.success(), "pg_ctl stop failed");
        self.pg_ctl_start().expect("restart the test server");
    }

    /// The watchdog stops the server and removes the directory once our end of its stdin
    /// closes: when this cluster is dropped or this process ends, however it ends.
    fn start_watchdog(&mut self) {
        let stop = format!(
            "{} -D {} -m immediate stop",
            self.bin.join("pg_ctl").display(),
            self.data().display()
        );
        let stop = if self.as_postgres {
            format!("runuser -u postgres -- {stop}")
        } else {
            stop
        };
        let script = format!(
            "cat >/dev/null; {stop} >/dev/null 2>&1; rm -rf {}",
            self.dir.display()
        );
        let mut child = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the test cluster's watchdog");
        let stdin = child.stdin.take().expect("piped stdin");
        *self.watchdog.lock().unwrap() = Some((child, stdin));
    }

    /// Create a fresh, empty schema for a test.
    pub fn create_db(&self) -> TestDb {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let schema = format!("t{}", NEXT.fetch_add(1, Ordering::Relaxed));
        // Open to every role: tests log in as other users too.
        self.psql(
            TEST_DATABASE,
            &format!("CREATE SCHEMA {schema}; GRANT ALL ON SCHEMA {schema} TO PUBLIC"),
        );
        TestDb {
            url: format!(
                "postgresql://postgres@/{TEST_DATABASE}?host={}&port={}&options=-c%20search_path%3D{schema}",
                self.dir.display(),
                self.port
            ),
            name: TEST_DATABASE.into(),
            schema,
            socket_dir: self.dir.clone(),
            port: self.port,
        }
    }

    /// Run SQL as the superuser through the socket (panics if it fails).
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let out = Command::new(self.bin.join("psql"))
            .arg("-h")
            .arg(&self.dir)
            .args(["-p", &self.port.to_string(), "-U", "postgres", "-d", db])
            .args(["-v", "ON_ERROR_STOP=1", "-X", "-q", "-A", "-t", "-c", sql])
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "psql {sql:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if let Some((mut child, stdin)) = self.watchdog.lock().unwrap().take() {
            drop(stdin);
            let _ = child.wait();
        }
    }
}

/// Where PostgreSQL's server binaries are; panics saying how to get them.
fn server_bin() -> PathBuf {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(dir) = std::env::var_os("HIGHWATER_PG_BIN") {
        candidates.push(dir.into());
    }
    candidates.push("/usr/lib/postgresql/15/bin".into());
    let mut others: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .collect();
    others.sort_by_key(|p| {
        let version = p
            .parent()
            .and_then(|v| v.file_name())
            .map(|v| v.to_string_lossy().into_owned());
        std::cmp::Reverse(version.and_then(|v| v.parse::<u32>().ok()).unwrap_or(0))
    });
    candidates.extend(others);
    for dir in &candidates {
        if ["initdb", "pg_ctl", "postgres", "psql"]
            .iter()
            .all(|b| dir.join(b).is_file())
        {
            return dir.clone();
        }
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    panic!(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres, psql) not found in {candidates:?}; \
         these tests need a real PostgreSQL: install it (Debian/Ubuntu: apt-get install postgresql, \
         which .ci/test does) or point HIGHWATER_PG_BIN at its bin directory{}",
        if ci { " (CI=true: never skipped)" } else { "" }
    );
}

fn chown_to_postgres(dir: &Path) {
    let out = Command::new("id")
        .args(["-u", "postgres"])
        .output()
        .expect("run id -u postgres");
    let uid: u32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("running as root, the tests need a `postgres` user (from the postgresql package)");
    let out = Command::new("id")
        .args(["-g", "postgres"])
        .output()
        .expect("run id -g postgres");
    let gid: u32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("the postgres user's group");
    std::os::unix::fs::chown(dir, Some(uid), Some(gid)).expect("chown the test cluster's dir");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("find a free loopback port")
}
