use serde_json::json;

use crate::store::postgres::history::{append, read, MAX_SAMPLES};
use crate::store::postgres::test_db::with_job;

#[tokio::test]
async fn records_are_kept_in_the_order_written_and_samples_past_the_bound_are_thinned() {
    let (_db, client, job) = with_job().await;
    let records = [
        json!({"kind": "run", "n": 1}),
        json!({"kind": "sample", "n": 2}),
        json!({"kind": "sample", "n": 3}),
    ];
    append(&client, job, &records).await.unwrap();
    append(&client, job, &[json!({"kind": "sample", "n": 4})])
        .await
        .unwrap();
    let kept: Vec<i64> = read(&client, job)
        .await
        .unwrap()
        .iter()
        .map(|r| r["n"].as_i64().unwrap())
        .collect();
    assert_eq!(kept, [1, 2, 3, 4]);

    // At the bound (its three samples and as many more as make it), one more sample thins
    // every other one of the older three quarters.
    client
        .execute(
            "INSERT INTO hw_history (job_id, sample, record)
             SELECT $1, true, json_build_object('kind', 'sample', 'n', 100 + g)::jsonb
             FROM generate_series(1, $2::bigint) AS g",
            &[&job.0, &(MAX_SAMPLES - 3)],
        )
        .await
        .unwrap();
    append(&client, job, &[json!({"kind": "sample", "n": -1})])
        .await
        .unwrap();
    let after = read(&client, job).await.unwrap();
    let samples = after.iter().filter(|r| r["kind"] == "sample").count() as i64;
    let before = MAX_SAMPLES + 1;
    // Rows n (1-based, by sequence) with n * 4 < before * 3 and n even are deleted.
    let deleted = (1..=before)
        .filter(|n| n * 4 < before * 3 && n % 2 == 0)
        .count() as i64;
    assert_eq!(samples, before - deleted);
    assert_eq!(after.first().unwrap()["n"], 1, "not a sample: kept");
    assert_eq!(after.last().unwrap()["n"], -1, "the newest sample is kept");
}
