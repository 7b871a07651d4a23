//! How many KV events per second the publisher sustains: synthetic batches
//! (one `BlockStored` of 8 blocks x 16 tokens and one `BlockRemoved` of 8
//! hashes per batch, what a busy engine step might record) pushed through
//! the real sink, encoder and PUB socket to a zeromq SUB socket on
//! loopback, in this process.
//!
//! `cargo run --release -p server --example kv_events_bench [BATCHES]`
//! (or `--profile test`, opt-level 3, which reuses the test build).
//!
//! Measured 2026-12-02 on this 2-core machine (other builds running, so
//! noisy), `--profile test`: 20,000-50,000 batches sustained 190k-280k
//! batches/s = 0.38-0.56 M events/s at the subscriber, with no drop;
//! `publish` on the engine thread 0.3-0.5 us per batch.
//!
//! Prints: the engine-side cost of `publish` (clock read + queue push), the
//! publisher thread's rate (encode + send, from the first push until the
//! last batch left the socket) and the rate the subscriber received. A
//! measurement, not a test.

use engine::kv::{BlockHash, KvEvent, KvEventSink, KvMedium};
use server::kv_events::publisher::{self, Attach, PublisherConfig};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use zeromq::{Socket, SocketRecv, SubSocket};

fn batch(i: u64) -> Vec<KvEvent> {
    let base = u128::from(i) * 8;
    vec![
        KvEvent::BlockStored {
            block_hashes: (0..8).map(|k| BlockHash(base + k)).collect(),
            parent_block_hash: Some(BlockHash(base + 1_000_000)),
            token_ids: (0..128).map(|t| 1000 + t + (i % 30_000) as u32).collect(),
            block_size: 16,
            lora_id: None,
            medium: KvMedium::Gpu,
        },
        KvEvent::BlockRemoved {
            block_hashes: (0..8).map(|k| BlockHash(base + 500_000 + k)).collect(),
            medium: KvMedium::Gpu,
        },
    ]
}

fn main() -> anyhow::Result<()> {
    let n: u64 = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(50_000);
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut sink = publisher::start(PublisherConfig {
        endpoint: Attach::Bind(format!("*:{port}")),
        replay: None,
        buffer_steps: 10_000,
        max_queue_size: n as usize + 16,
        topic: String::new(),
        data_parallel_rank: 0,
    })?;
    let stats = sink.stats();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut sub = rt.block_on(async {
        let mut sub = SubSocket::new();
        sub.connect(&format!("tcp://127.0.0.1:{port}")).await?;
        sub.subscribe("").await?;
        anyhow::Ok(sub)
    })?;
    // Wait for the subscription to reach the publisher (PUB drops until then).
    let mut warm = 0u64;
    rt.block_on(async {
        loop {
            sink.publish(batch(1 << 40));
            warm += 1;
            if tokio::time::timeout(Duration::from_millis(100), sub.recv())
                .await
                .is_ok()
            {
                break;
            }
        }
    });
    let published_before = stats.published.load(Ordering::Relaxed);
    let batches: Vec<Vec<KvEvent>> = (0..n).map(batch).collect();
    let events_per_batch = 2u64;
    let t0 = Instant::now();
    let mut push = Duration::ZERO;
    for b in batches {
        let t = Instant::now();
        sink.publish(b);
        push += t.elapsed();
    }
    let (received, recv_done) = rt.block_on(async {
        let mut got = 0u64;
        let mut last = t0.elapsed();
        while got < n {
            match tokio::time::timeout(Duration::from_secs(5), sub.recv()).await {
                Ok(Ok(m)) => {
                    let seq = u64::from_be_bytes(
                        m.get(1)
                            .map_or([0; 8], |b| b[..].try_into().unwrap_or([0; 8])),
                    );
                    if seq >= warm {
                        got += 1;
                        last = t0.elapsed();
                    }
                }
                _ => break,
            }
        }
        (got, last)
    });
    let published = stats.published.load(Ordering::Relaxed) - published_before;
    let dropped = stats.dropped.load(Ordering::Relaxed);
    let secs = recv_done.as_secs_f64();
    println!(
        "batches: {n} ({events_per_batch} events each: 8 stored blocks x 16 tokens, 8 removed)"
    );
    println!(
        "engine side: publish() {:.2} us per batch (clock + queue push)",
        push.as_secs_f64() * 1e6 / n as f64
    );
    println!("published {published}, dropped {dropped}, received {received}");
    println!(
        "sustained (first push to last receipt): {:.0} batches/s = {:.0} events/s = {:.0} blocks/s",
        received as f64 / secs,
        (received * events_per_batch) as f64 / secs,
        (received * 16) as f64 / secs
    );
    Ok(())
}
