//! A job of IDs from an iterator for the crash test: `kill_resume STATE N CALLS` runs IDs
//! 0..N with a closure that notes every call in the file CALLS (one ID a line) and fails the
//! IDs ending in 999; kill it at any moment and run the same command again to resume.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use highwater::{Failure, Job};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [state, n, calls] = &args[..] else {
        return Err("usage: kill_resume STATE N CALLS".into());
    };
    let n: u64 = n.parse()?;
    let calls = Arc::new(Mutex::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(calls)?,
    ));
    let work = move |id: String| {
        let calls = calls.clone();
        async move {
            // One write of the whole line: a kill between an ID and its newline would glue
            // it to the next run's first line.
            let line = format!("{id}\n");
            calls
                .lock()
                .unwrap()
                .write_all(line.as_bytes())
                .map_err(|e| Failure::permanent(format!("cannot note the call: {e}")))?;
            tokio::time::sleep(Duration::from_millis(1)).await;
            if id.ends_with("999") {
                return Err(Failure::permanent(format!("{id} is refused")));
            }
            Ok(serde_json::json!({ "id": id }))
        }
    };
    let summary = Job::new(work)
        .name("kill-resume")
        .ids((0..n).map(|i| i.to_string()))
        .state_dir(state)
        .bucket_size(100)
        .run()
        .await?;
    println!("ok {} failed {}", summary.job.ok, summary.job.failed);
    Ok(())
}
