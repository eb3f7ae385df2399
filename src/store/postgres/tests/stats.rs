use crate::store::postgres::planner::acquire_planner;
use crate::store::postgres::stats::*;
use crate::store::postgres::test_db::{add_buckets, expire, with_job, worker};
use crate::store::Log;

#[tokio::test]
async fn planning_says_who_plans_and_when_the_job_waits_for_the_input() {
    let (_db, client, job) = with_job().await;
    assert_eq!(planning(&client, job).await.unwrap().state, "waiting");
    let a = worker(&client, job).await;
    acquire_planner(&client, job, &a).await.unwrap().unwrap();
    let p = planning(&client, job).await.unwrap();
    assert_eq!((p.state, p.planner.as_deref()), ("planning", Some(&*a.0)));
    expire(&client, job, &a).await;
    let p = planning(&client, job).await.unwrap();
    assert_eq!((p.state, p.planner), ("waiting", Some(a.0.clone())));
    client
        .execute(
            "UPDATE hw_job SET planner_exhausted = true WHERE job_id = $1",
            &[&job.0],
        )
        .await
        .unwrap();
    assert_eq!(planning(&client, job).await.unwrap().state, "done");
}

#[tokio::test]
async fn a_log_is_finished_once_planned_to_its_end_with_every_bucket_committed() {
    let (_db, client, job) = with_job().await;
    add_buckets(&client, job, 3).await;
    assert!(!finished(&client, job, Log::Job).await.unwrap());
    client
        .execute(
            "UPDATE hw_job SET planner_exhausted = true WHERE job_id = $1",
            &[&job.0],
        )
        .await
        .unwrap();
    assert!(
        !finished(&client, job, Log::Job).await.unwrap(),
        "open buckets"
    );
    client
        .execute(
            "UPDATE hw_bucket SET state = 'committed', owner = gen_random_uuid(),
                 committed_at = now() WHERE job_id = $1",
            &[&job.0],
        )
        .await
        .unwrap();
    assert!(finished(&client, job, Log::Job).await.unwrap());
    assert!(
        finished(&client, job, Log::Rerun(1)).await.unwrap(),
        "no buckets"
    );
}
