//! The JSONL and CSV exports of paginated IDs, whose items are written page by page: the
//! same bytes as the same records with their items joined into their bodies, and as the
//! export wrote before it streamed them (the lines below), for every shape of body: many
//! pages, items that need quoting in CSV, one item that does not, none at all.

use super::{export, ExportFormat, InputColumns};
use crate::failure::{AttemptNote, ErrorClass};
use crate::handler::paginate::NextRequest;
use crate::meter::Usage;
use crate::store::mem::MemStore;
use crate::store::{
    ItemRecord, ItemStatus, LeaseScope, Leases, OffsetRecord, PageMark, PageRecord, PlannedBucket,
    PlannerState, Store,
};

/// Each ID's pages (each page's items as a JSON array), or none for a record with a body of
/// its own.
const IDS: [(&str, Option<&[&str]>); 8] = [
    (
        "many",
        Some(&[r#"[{"k":0,"s":"a, \"b\""},{"k":1}]"#, "[2,3]", r#"["x"]"#]),
    ),
    ("none", Some(&["[]"])),
    ("one-number", Some(&["[7]"])),
    ("empty-then-one", Some(&["[]", "[ 8 ]"])),
    ("one-each", Some(&["[1]", "[2]"])),
    ("a string", Some(&[r#"["l1\nl2"]"#])),
    ("plain", None),
    ("failed", None),
];

/// The JSON lines the export wrote before it streamed a paginated ID's items.
const JSONL: &str = r#"{"id":"many","status":"ok","http_status":200,"body":[{"k":0,"s":"a, \"b\""},{"k":1},2,3,"x"],"attempts":2,"bucket":0,"attempt_errors":[{"class":"http","http_status":503}]}
{"id":"none","status":"ok","http_status":200,"body":[],"attempts":2,"bucket":0,"attempt_errors":[{"class":"http","http_status":503}]}
{"id":"one-number","status":"ok","http_status":200,"body":[7],"attempts":2,"bucket":0,"attempt_errors":[{"class":"http","http_status":503}]}
{"id":"empty-then-one","status":"ok","http_status":200,"body":[8],"attempts":2,"bucket":0,"attempt_errors":[{"class":"http","http_status":503}]}
{"id":"one-each","status":"ok","http_status":200,"body":[1,2],"attempts":2,"bucket":0,"attempt_errors":[{"class":"http","http_status":503}]}
{"id":"a string","status":"ok","http_status":200,"body":["l1\nl2"],"attempts":2,"bucket":0,"attempt_errors":[{"class":"http","http_status":503}]}
{"id":"plain","status":"ok","http_status":200,"body":[6,99],"attempts":2,"bucket":0,"attempt_errors":[{"class":"http","http_status":503}],"usage":{"input":5,"output":6}}
{"id":"failed","status":"failed","http_status":404,"error":"HTTP 404: \"gone\", for good","error_class":"http","attempts":2,"bucket":0,"attempt_errors":[{"class":"http","http_status":503}]}
"#;

/// The CSV the export wrote before it streamed a paginated ID's items.
const CSV: &str = r#"id,status,http_status,body,error,error_class,attempts,bucket,usage_input,usage_output
many,ok,200,"[{""k"":0,""s"":""a, \""b\""""},{""k"":1},2,3,""x""]",,,2,0,,
none,ok,200,[],,,2,0,,
one-number,ok,200,[7],,,2,0,,
empty-then-one,ok,200,[8],,,2,0,,
one-each,ok,200,"[1,2]",,,2,0,,
a string,ok,200,"[""l1\nl2""]",,,2,0,,
plain,ok,200,"[6,99]",,,2,0,5,6
failed,failed,404,,"""HTTP 404: \""gone\"", for good""",http,2,0,,
"#;

fn at(row: u64) -> crate::input::Cursor {
    crate::input::Cursor {
        row,
        line: row + 1,
        byte: row * 10,
    }
}

/// A finished job of [`IDS`] in one bucket: with `paged`, each paginated ID's result is its
/// pages; without, the same items joined into its body.
async fn job(paged: bool) -> MemStore {
    let s = MemStore::new();
    let n = IDS.len() as u64;
    let plan = PlannedBucket {
        offset: OffsetRecord {
            bucket: 0,
            start: at(0),
            end: at(n),
            items: n,
            duplicates: 0,
            bad_lines: 0,
            input: crate::input::Fingerprint { len: 99, xxh3: 7 },
            planned_at_ms: 1,
        },
        items: (0..)
            .zip(IDS.iter().map(|(id, _)| id.to_string()))
            .collect(),
        values: Vec::new(),
        bad_lines: Vec::new(),
    };
    let planner = PlannerState {
        next_bucket: 1,
        cursor: at(n),
        exhausted: true,
    };
    s.plan(&[plan], &planner).await.unwrap();
    let _lease = s.acquire(LeaseScope::Job).await.unwrap().unwrap();
    for (row, (id, pages)) in (0..).zip(IDS) {
        let mut r = ItemRecord::pending(row, 0);
        r.status = ItemStatus::Ok;
        r.http_status = Some(200);
        r.attempts = 2;
        r.attempt_errors = vec![AttemptNote {
            class: ErrorClass::Http,
            http_status: Some(503),
            free: false,
        }];
        match (id, pages) {
            ("failed", _) => {
                r.status = ItemStatus::Failed;
                r.http_status = Some(404);
                r.error = Some("HTTP 404: \"gone\", for good".into());
                r.class = Some(ErrorClass::Http);
            }
            (_, None) => {
                r.body = Some(serde_json::value::to_raw_value(&[row, 99]).unwrap());
                r.usage = Some(Usage {
                    input: 5,
                    output: 6,
                });
            }
            (_, Some(pages)) if paged => {
                let mut before = 0;
                for (page, items) in (0..).zip(pages) {
                    let count = serde_json::from_str::<Vec<serde_json::Value>>(items)
                        .unwrap()
                        .len() as u32;
                    let last = page + 1 == pages.len() as u32;
                    let next = NextRequest::Query(vec![("page".into(), (page + 2).to_string())]);
                    let record = PageRecord {
                        row,
                        bucket: 0,
                        generation: 0,
                        mark: PageMark {
                            page,
                            count,
                            items_before: before,
                            next: (!last).then_some(next),
                            attempts: page + 1,
                            usage: None,
                            first_attempt_ms: None,
                        },
                        items: serde_json::value::RawValue::from_string(items.to_string()).unwrap(),
                    };
                    s.record_pages(&[(id.to_string(), record)]).await.unwrap();
                    before += u64::from(count);
                }
                r.pages = Some(pages.len() as u32);
            }
            (_, Some(pages)) => {
                let items: Vec<serde_json::Value> = pages
                    .iter()
                    .flat_map(|p| serde_json::from_str::<Vec<serde_json::Value>>(p).unwrap())
                    .collect();
                r.body = Some(serde_json::value::to_raw_value(&items).unwrap());
            }
        }
        s.record(&[(id.to_string(), r)]).await.unwrap();
    }
    s.sync().await.unwrap();
    s
}

async fn exported(s: &MemStore, format: ExportFormat, only: Option<ItemStatus>) -> String {
    let mut out = Vec::new();
    export(s, format, only, &InputColumns::none(), &mut out)
        .await
        .unwrap();
    String::from_utf8(out).unwrap()
}

#[tokio::test]
async fn a_paginated_ids_items_are_exported_as_the_joined_body_was() {
    let paged = job(true).await;
    let whole = job(false).await;
    for format in [ExportFormat::Jsonl, ExportFormat::Csv] {
        for only in [None, Some(ItemStatus::Ok), Some(ItemStatus::Failed)] {
            let streamed = exported(&paged, format, only).await;
            let joined = exported(&whole, format, only).await;
            assert_eq!(streamed, joined, "{format:?}, {only:?}");
        }
    }
    assert_eq!(exported(&paged, ExportFormat::Jsonl, None).await, JSONL);
    assert_eq!(exported(&paged, ExportFormat::Csv, None).await, CSV);
}
