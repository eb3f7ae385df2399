//! A job whose work is a closure: square 1,000 numbers, keep the results in a state
//! directory, then read them back as typed records.

use highwater::{Failure, Job, Results};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Square {
    n: u64,
    square: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let state = tempfile::tempdir()?;
    // The work for one ID: any async closure returning a result or a Failure.
    let square = |id: String| async move {
        let n: u64 = id.parse().map_err(|_| Failure::permanent("not a number"))?;
        if n % 100 == 0 {
            return Err(Failure::permanent(format!("{n} is refused")));
        }
        Ok(serde_json::json!(Square { n, square: n * n }))
    };
    let summary = Job::new(square)
        .ids((1..=1000).map(|n| n.to_string()))
        .state_dir(state.path())
        .run()
        .await?;
    println!("ok {} failed {}", summary.job.ok, summary.job.failed);

    let mut results = Results::open(state.path())?;
    let mut total = 0;
    while let Some(record) = results.next::<Square>().await? {
        match record.result {
            Some(s) => total += s.square,
            None => println!("{} failed: {}", record.id, record.error.unwrap_or_default()),
        }
    }
    println!("sum of squares {total}");
    Ok(())
}
