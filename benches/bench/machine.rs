//! What the machine was doing while the bench ran: CPU time of this process, of its children
//! and of everyone else, the load average, and the facts every report opens with.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// User + system CPU time of this whole process (all threads) so far.
pub fn process_cpu() -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    tv(u.ru_utime) + tv(u.ru_stime)
}

pub fn tv(t: libc::timeval) -> Duration {
    Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
}

/// Microseconds of CPU per item.
pub fn us_per(cpu: Duration, n: u64) -> f64 {
    cpu.as_secs_f64() * 1e6 / n.max(1) as f64
}

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "?".into())
}

fn first_line_with(path: &str, prefix: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().and_then(|text| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    })
}

/// What the machine was doing when the benchmark started, to tell afterwards how much CPU
/// other processes took meanwhile (a noise indicator).
pub struct Baseline {
    load: String,
    busy: Option<Duration>,
    own: Duration,
}

impl Baseline {
    pub fn now() -> Baseline {
        Baseline {
            load: loadavg(),
            busy: machine_busy(),
            own: own_and_children_cpu(),
        }
    }

    /// CPU time used by processes other than this one and its children since `self`.
    pub fn others(&self) -> Option<Duration> {
        let busy = machine_busy()?.checked_sub(self.busy?)?;
        Some(busy.saturating_sub(own_and_children_cpu().saturating_sub(self.own)))
    }
}

/// Busy CPU time of the whole machine since boot (/proc/stat; idle and iowait excluded).
fn machine_busy() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    let busy: u64 = [0, 1, 2, 5, 6, 7].iter().filter_map(|&i| f.get(i)).sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| Duration::from_secs_f64(busy as f64 / hz as f64))
}

/// CPU time of this process plus its reaped children.
fn own_and_children_cpu() -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) };
    process_cpu() + tv(u.ru_utime) + tv(u.ru_stime)
}

pub fn machine_facts(tmp: &Path, baseline: &Baseline, elapsed: Duration) -> String {
    let cpus_n = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let others = match baseline.others() {
        Some(o) => format!(
            "{:.0}% of the machine's CPU time ({:.1} CPU-s over {:.0} s; near 0% on a quiet \
             machine, higher means the figures are noisy)",
            100.0 * o.as_secs_f64() / (elapsed.as_secs_f64() * cpus_n as f64).max(1e-9),
            o.as_secs_f64(),
            elapsed.as_secs_f64()
        ),
        None => "unknown".into(),
    };
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get().to_string())
        .unwrap_or_else(|_| "?".into());
    let model = first_line_with("/proc/cpuinfo", "model name").unwrap_or_else(|| "?".into());
    let mem = first_line_with("/proc/meminfo", "MemTotal")
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map(|kib| format!("{:.1} GiB", kib as f64 / (1u64 << 20) as f64))
        .unwrap_or_else(|| "?".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    let rustc = Command::new("rustc")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "?".into());
    let profile = if cfg!(debug_assertions) {
        "without optimizations"
    } else {
        "optimized"
    };
    format!(
        "- machine: {cpus} CPUs (available_parallelism), {model}, {mem} RAM, Linux {kernel}\n\
         - toolchain: {rustc}; this bench process built {profile}; the binary under test \
           as it was built (`--bin` names another)\n\
         - load average (1/5/15 min) at start: {}, at end: {}\n\
         - other processes used {others} while this ran\n\
         - temporary files (input, state) under: {} ({})\n",
        baseline.load,
        loadavg(),
        tmp.display(),
        filesystem_of(tmp)
    )
}

/// "ext4 on /dev/vda" for the mount holding `path`, from /proc/mounts.
fn filesystem_of(path: &Path) -> String {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 3 && path.starts_with(f[1])).then(|| (f[1].len(), f[2], f[0]))
        })
        .max_by_key(|(len, _, _)| *len)
        .map(|(_, fs, dev)| format!("{fs} on {dev}"))
        .unwrap_or_else(|| "filesystem unknown".into())
}
