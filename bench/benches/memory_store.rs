//! MemoryStore acquire+release pairs per second on 1 and 2 threads, against a
//! baseline doing the minimal equivalent work: a locked hash map insert and
//! remove plus the same capability computation (derive on acquire, verify on
//! release). BENCHMARKS.md reports the ratio of the two, measured in one run.
//!
//! `cargo bench -p tollgate-bench --bench memory_store`

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use jiff::{SignedDuration, Timestamp};
use tollgate::{
    AcquireRequest, Allocator, CapabilityKey, GrantPolicy, LeaseId, MemoryStore, NewAccount,
    StoreId,
};

const THREADS: [usize; 2] = [1, 2];

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("tokio runtime")
}

/// Runs `iters` pairs split over `threads` threads and returns the wall time.
fn run_threads(threads: usize, iters: u64, work: Arc<dyn Fn(u64) + Send + Sync>) -> Duration {
    let per_thread = iters / threads as u64 + 1;
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            let work = work.clone();
            s.spawn(move || work(per_thread));
        }
    });
    start.elapsed()
}

fn memory_store(c: &mut Criterion) {
    let mut group = c.benchmark_group("acquire_release_pair");
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(5));
    let now: Timestamp = "2026-11-29T12:00:00.123456789Z".parse().expect("instant");
    for threads in THREADS {
        let policy =
            GrantPolicy::new(SignedDuration::from_secs(60), SignedDuration::ZERO).expect("policy");
        let store = Arc::new(
            MemoryStore::new(policy, CapabilityKey::new(&[7; 32]).expect("key")).expect("store"),
        );
        let rt = runtime();
        let mut accounts = Vec::new();
        for t in 0..threads {
            let a = rt
                .block_on(store.create_account(NewAccount {
                    name: format!("bench-{t}"),
                    api_key_sha256: None,
                }))
                .expect("account");
            rt.block_on(store.deposit(a.account_id, i64::MAX / 4, now))
                .expect("deposit");
            accounts.push(a.account_id);
        }
        let next = Arc::new(AtomicI64::new(0));
        group.bench_function(format!("memory_store/{threads}_threads"), |b| {
            b.iter_custom(|iters| {
                let store = store.clone();
                let accounts = accounts.clone();
                let next = next.clone();
                run_threads(
                    threads,
                    iters,
                    Arc::new(move |n| {
                        let t = next.fetch_add(1, Ordering::Relaxed) as usize % accounts.len();
                        let rt = runtime();
                        rt.block_on(async {
                            for _ in 0..n {
                                let g = store
                                    .acquire(
                                        AcquireRequest {
                                            account_id: accounts[t],
                                            units: 1,
                                            ttl: SignedDuration::new(30, 1),
                                            idempotency_key: None,
                                        },
                                        now.into(),
                                    )
                                    .await
                                    .expect("acquire");
                                let s = store
                                    .release(g.lease_id, &g.capability, now, Some(1))
                                    .await
                                    .expect("release");
                                black_box(s);
                            }
                        });
                    }),
                )
            })
        });

        // Baseline: the minimal equivalent work.
        let key = CapabilityKey::new(&[7; 32]).expect("key");
        let store_id = StoreId([1; 16]);
        let map: Arc<Mutex<HashMap<i64, (i64, Timestamp)>>> = Arc::new(Mutex::new(HashMap::new()));
        let ids = Arc::new(AtomicI64::new(0));
        group.bench_function(format!("baseline_locked_map/{threads}_threads"), |b| {
            b.iter_custom(|iters| {
                let map = map.clone();
                let ids = ids.clone();
                let key = key.clone();
                run_threads(
                    threads,
                    iters,
                    Arc::new(move |n| {
                        let rt = runtime();
                        rt.block_on(async {
                            for _ in 0..n {
                                let id = ids.fetch_add(1, Ordering::Relaxed);
                                let cap = key.derive(store_id, LeaseId(id));
                                map.lock().expect("lock").insert(id, (1, now));
                                let ok = key.verify(store_id, LeaseId(id), &cap);
                                let v = map.lock().expect("lock").remove(&id);
                                black_box((ok, v));
                            }
                        });
                    }),
                )
            })
        });
    }
    group.finish();
}

criterion_group!(benches, memory_store);
criterion_main!(benches);
