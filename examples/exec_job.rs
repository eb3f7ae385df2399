//! An exec-style job: one process per ID (here `sh`, given the ID as one argument, never
//! spliced into the script), its standard output the result, a non-zero exit a failure
//! whose message is the tail of its standard error.

use std::process::Command;

use highwater::{Failure, Job, Output, Results};

/// Triples a number; refuses multiples of 7 (exit 3) and says why on standard error.
const SCRIPT: &str = r#"
if [ $(($1 % 7)) -eq 0 ]; then echo "$1 is a multiple of 7" >&2; exit 3; fi
echo "{\"id\": \"$1\", \"tripled\": $(($1 * 3))}"
"#;

async fn run_script(id: String) -> Result<Output, Failure> {
    let out = tokio::task::spawn_blocking(move || {
        Command::new("sh").args(["-c", SCRIPT, "sh", &id]).output()
    })
    .await
    .map_err(|e| Failure::retry(format!("the process task failed: {e}")))?
    .map_err(|e| Failure::permanent(format!("cannot start sh: {e}")))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(Failure::permanent(stderr.trim().to_owned()));
    }
    // Stored as JSON when it parses, else as a string.
    Ok(Output::text_or_json(out.stdout))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let state = tempfile::tempdir()?;
    let summary = Job::new(run_script)
        .name("triple")
        .ids((1..=50).map(|n| n.to_string()))
        .state_dir(state.path())
        .concurrency(4)
        .run()
        .await?;
    println!("ok {} failed {}", summary.job.ok, summary.job.failed);
    let mut results = Results::open(state.path())?;
    while let Some(r) = results.next::<serde_json::Value>().await? {
        match (r.id.as_str(), &r.result, &r.error) {
            ("1" | "2" | "50", Some(result), _) => println!("{} -> {result}", r.id),
            (_, None, Some(error)) => println!("{} failed: {error}", r.id),
            _ => {}
        }
    }
    Ok(())
}
