//! Reading a finished job's results and failures: typed records from a state directory,
//! the command line's or a library program's (`read_results DIR`); without an argument it
//! first runs a small job of its own to read.

use highwater::{Failure, Job, Results};
use serde_json::value::RawValue;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let own = tempfile::tempdir()?;
    let state = match std::env::args_os().nth(1) {
        Some(dir) => dir.into(),
        None => {
            let even = |id: String| async move {
                match id.parse::<u64>() {
                    Ok(n) if n % 2 == 0 => Ok(serde_json::json!({ "half": n / 2 })),
                    _ => Err(Failure::permanent(format!("{id} is odd"))),
                }
            };
            Job::new(even)
                .ids((1..=10).map(|n| n.to_string()))
                .state_dir(own.path())
                .run()
                .await?;
            own.path().to_path_buf()
        }
    };
    // Every final record, its result kept as raw JSON.
    let mut results = Results::open(&state)?;
    let (mut ok, mut failed) = (0, 0);
    while let Some(r) = results.next::<Box<RawValue>>().await? {
        match r.result {
            Some(result) => {
                ok += 1;
                println!("ok {} {}", r.id, result.get());
            }
            None => failed += 1,
        }
    }
    println!("{ok} ok, {failed} failed");
    // Only the failures, with their class and attempts.
    let mut failures = results.from_start().failures();
    while let Some(r) = failures.next::<serde_json::Value>().await? {
        let class = r.class.map(|c| c.to_string()).unwrap_or_default();
        let error = r.error.unwrap_or_default();
        println!(
            "failed {} [{class}] after {} attempts: {error}",
            r.id, r.attempts
        );
    }
    Ok(())
}
