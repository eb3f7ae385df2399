//! `parquet-input`: the real binary over a Parquet input (row groups of 100,000 rows, one
//! null ID) beside the same IDs as a text file: peak RSS and elapsed of each, and the
//! resident memory through the run, to show that reading Parquet by row group keeps memory
//! flat.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use parquet::data_type::{ByteArray, ByteArrayType};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

use highwater::demo::api::{ApiConfig, FakeApi};

use crate::args::Args;
use crate::child::{binary, run_args, Exit, Proc};
use crate::machine::{machine_facts, Baseline};
use crate::numbers::{kib_mib, mib, thousands};
use crate::scratch::{finish_temp, id_of, temp_dir, write_input};

/// Rows per row group of the Parquet input.
const GROUP_ROWS: u64 = 100_000;

/// One run: its exit, elapsed, peak RSS and the resident memory at each tenth of the calls.
struct Measured {
    exit: Exit,
    elapsed: Duration,
    hwm_kib: u64,
    tenths: Vec<u64>,
    calls: u64,
    bad_lines: String,
}

pub fn parquet_input(rt: &tokio::runtime::Runtime, args: &Args, command: &str) -> Result<()> {
    let baseline = Baseline::now();
    let started = Instant::now();
    let bin = binary(args)?;
    let n = args.ids;
    let (guard, tmp) = temp_dir(args.keep)?;
    let null_row = n / 2;
    let parquet = tmp.join("ids.parquet");
    let parquet_bytes = write_parquet(&parquet, n, null_row)?;
    let text = tmp.join("ids.txt");
    let text_bytes = write_input(&text, n)?;
    eprintln!(
        "wrote {} rows to {} ({}) and {} ({})",
        thousands(n),
        parquet.display(),
        mib(parquet_bytes),
        text.display(),
        mib(text_bytes)
    );
    let p = measure(rt, &bin, &parquet, &tmp, "parquet", n - 1, args.concurrency)?;
    let t = measure(rt, &bin, &text, &tmp, "text", n, args.concurrency)?;

    let mut out = String::new();
    writeln!(out, "\n## Parquet input memory (real binary)\n")?;
    writeln!(out, "- command: `{command}`")?;
    out.push_str(&machine_facts(&tmp, &baseline, started.elapsed()));
    writeln!(
        out,
        "- inputs: {} rows (`id-000000000`...) as Parquet (one optional UTF8 column, row \
         groups of {} rows, snappy; row {} null) {}, and as text {}",
        thousands(n),
        thousands(GROUP_ROWS),
        thousands(null_row),
        mib(parquet_bytes),
        mib(text_bytes)
    )?;
    writeln!(
        out,
        "- binary run as `highwater run --input FILE [--id-column id --skip-bad-lines] --url \
         http://127.0.0.1:PORT/items/{{id}} --state DIR --concurrency {} --progress-interval 0 \
         -q` against the fake API in this process\n",
        args.concurrency
    )?;
    writeln!(
        out,
        "| input | elapsed | peak RSS (VmHWM) | peak RSS (ru_maxrss) | VmRSS at 10%, 20%, ... 100% of the calls | calls | bad lines | exit |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---|---:|---|---|")?;
    for (name, m) in [("Parquet", &p), ("text", &t)] {
        let tenths: Vec<String> = m.tenths.iter().map(|k| format!("{}", k / 1024)).collect();
        writeln!(
            out,
            "| {name} | {:.1} s | {} | {} | {} MiB | {} | {} | {} |",
            m.elapsed.as_secs_f64(),
            kib_mib(m.hwm_kib),
            kib_mib(m.exit.max_rss_kib),
            tenths.join(", "),
            thousands(m.calls),
            m.bad_lines,
            m.exit.describe()
        )?;
    }
    println!("{out}");
    finish_temp(guard, &tmp);
    if p.exit.code != Some(0) || t.exit.code != Some(0) {
        bail!("a run did not exit 0");
    }
    Ok(())
}

/// Write `n` distinct IDs (row `null_row` a null) as a Parquet file; returns its size.
fn write_parquet(path: &Path, n: u64, null_row: u64) -> Result<u64> {
    let schema = Arc::new(parse_message_type(
        "message ids { optional binary id (UTF8); }",
    )?);
    let props = Arc::new(
        WriterProperties::builder()
            .set_compression(parquet::basic::Compression::SNAPPY)
            .build(),
    );
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut writer = SerializedFileWriter::new(file, schema, props)?;
    let mut first = 0;
    while first < n {
        let rows = first..(first + GROUP_ROWS).min(n);
        let values: Vec<ByteArray> = rows
            .clone()
            .filter(|&i| i != null_row)
            .map(|i| ByteArray::from(id_of(i).as_str()))
            .collect();
        let defs: Vec<i16> = rows.clone().map(|i| i16::from(i != null_row)).collect();
        let mut group = writer.next_row_group()?;
        let mut column = group.next_column()?.context("the id column")?;
        column
            .typed::<ByteArrayType>()
            .write_batch(&values, Some(&defs), None)?;
        column.close()?;
        group.close()?;
        first = rows.end;
    }
    writer.close()?;
    Ok(std::fs::metadata(path)?.len())
}

fn measure(
    rt: &tokio::runtime::Runtime,
    bin: &Path,
    input: &Path,
    tmp: &Path,
    name: &str,
    expected_calls: u64,
    c: usize,
) -> Result<Measured> {
    let api = rt
        .block_on(FakeApi::start(ApiConfig::fast()))
        .context("starting the fake API")?;
    let state = tmp.join(format!("state-{name}"));
    let mut args = run_args(Some(input), &api.url_template(), &state, c);
    if name == "parquet" {
        args.extend(["--id-column".into(), "id".into(), "--skip-bad-lines".into()]);
    }
    eprintln!("{name}: {} {}", bin.display(), args.join(" "));
    let mut proc = Proc::spawn(bin, &args, &tmp.join(format!("{name}.stderr")))?;
    let mut hwm = 0;
    let mut tenths = Vec::new();
    let exit = loop {
        if let Some(e) = proc.reap(false)? {
            break e;
        }
        if let Some((rss, h)) = proc.memory() {
            hwm = hwm.max(h);
            let calls = api.total_calls();
            while tenths.len() < 10 && calls >= expected_calls * (tenths.len() as u64 + 1) / 10 {
                tenths.push(rss);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let calls = api.total_calls();
    rt.block_on(api.shutdown());
    let status = std::process::Command::new(bin)
        .args(["status", "--json", "--state"])
        .arg(&state)
        .output()
        .context("running status")?;
    let status: serde_json::Value =
        serde_json::from_slice(&status.stdout).context("status --json")?;
    let bad_lines = format!(
        "{} (row {})",
        status["stats"]["bad_lines"], status["bad_line_examples"][0]["row"]
    );
    Ok(Measured {
        elapsed: exit.at - proc.started,
        exit,
        hwm_kib: hwm,
        tenths,
        calls,
        bad_lines,
    })
}
