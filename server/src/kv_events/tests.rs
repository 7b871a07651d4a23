use super::publisher::Attach;
use super::*;
use engine::kv::KvEventSink;

#[test]
fn defaults_are_vllms() {
    let c = KvEventsConfig::parse("{}").expect("parses");
    assert_eq!(c, KvEventsConfig::default());
    assert_eq!(c.endpoint, "tcp://*:5557");
    assert_eq!(c.replay_endpoint, None);
    assert_eq!(
        (c.buffer_steps, c.hwm, c.max_queue_size),
        (10_000, 100_000, 100_000)
    );
    assert_eq!(c.topic, "");
    // publisher: zmq when enabled, null otherwise (vLLM's __post_init__).
    assert_eq!(c.publisher_kind(), PublisherKind::Null);
    assert!(!c.active());
    let on = KvEventsConfig::parse(r#"{"enable_kv_cache_events": true}"#).expect("parses");
    assert_eq!(on.publisher_kind(), PublisherKind::Zmq);
    assert!(on.active());
    let null =
        KvEventsConfig::parse(r#"{"enable_kv_cache_events": true, "publisher": "null"}"#).unwrap();
    assert!(!null.active());
    let off = KvEventsConfig::parse(r#"{"publisher": "zmq"}"#).unwrap();
    assert!(
        !off.active(),
        "not enabled: nothing, whatever the publisher"
    );
}

#[test]
fn every_field_parses() {
    let c = KvEventsConfig::parse(
        r#"{"enable_kv_cache_events": true, "publisher": "zmq",
            "endpoint": "tcp://*:6000", "replay_endpoint": "tcp://*:6001",
            "buffer_steps": 5, "hwm": 7, "max_queue_size": 9, "topic": "kv"}"#,
    )
    .expect("parses");
    assert_eq!(
        c,
        KvEventsConfig {
            enable_kv_cache_events: true,
            publisher: Some(PublisherKind::Zmq),
            endpoint: "tcp://*:6000".into(),
            replay_endpoint: Some("tcp://*:6001".into()),
            buffer_steps: 5,
            hwm: 7,
            max_queue_size: 9,
            topic: "kv".into(),
        }
    );
    let p = c.publisher_config().unwrap();
    assert_eq!(p.endpoint, Attach::Bind("*:6000".into()));
    assert_eq!(p.replay.as_deref(), Some("*:6001"));
    assert_eq!((p.buffer_steps, p.max_queue_size), (5, 9));
}

#[test]
fn bind_or_connect_follows_vllms_rule() {
    let attach = |ep: &str| {
        KvEventsConfig::parse(&format!(r#"{{"endpoint": "{ep}"}}"#))
            .unwrap()
            .publisher_config()
            .unwrap()
            .endpoint
    };
    assert_eq!(attach("tcp://*:1"), Attach::Bind("*:1".into()));
    assert_eq!(attach("tcp://[::]:1"), Attach::Bind("[::]:1".into()));
    assert_eq!(
        attach("tcp://collector:1"),
        Attach::Connect("tcp://collector:1".into())
    );
    assert_eq!(
        attach("tcp://127.0.0.1:1"),
        Attach::Connect("tcp://127.0.0.1:1".into())
    );
}

/// (JSON, text the error must contain: the field's name, and why).
const BAD: &[(&str, &[&str])] = &[
    (r#"{"enable_kv_cache_events": true"#, &["EOF"]),
    ("[]", &["JSON object"]),
    ("[true]", &["JSON object"]),
    (r#"{"topic": "a"} x"#, &["trailing characters"]),
    (
        r#"{"enable_kv_events": true}"#,
        &["unknown field `enable_kv_events`"],
    ),
    (
        r#"{"publisher": "kafka"}"#,
        &["`publisher`", "kafka", "`zmq`"],
    ),
    (r#"{"buffer_steps": -1}"#, &["`buffer_steps`", "-1"]),
    (r#"{"hwm": "lots"}"#, &["`hwm`", "lots"]),
    (r#"{"max_queue_size": 0}"#, &["`max_queue_size`", ">= 1"]),
    (
        r#"{"enable_kv_cache_events": "yes"}"#,
        &["`enable_kv_cache_events`"],
    ),
    (r#"{"topic": 5}"#, &["`topic`"]),
    (
        r#"{"endpoint": "ipc:///tmp/kv"}"#,
        &["`endpoint`", "tcp://"],
    ),
    (r#"{"endpoint": "tcp://*"}"#, &["`endpoint`", "HOST:PORT"]),
    (
        r#"{"endpoint": "tcp://*:99999"}"#,
        &["`endpoint`", "HOST:PORT"],
    ),
    (
        r#"{"replay_endpoint": "inproc://r"}"#,
        &["`replay_endpoint`"],
    ),
];

#[test]
fn bad_configs_name_the_field() {
    for (json, want) in BAD {
        let e = KvEventsConfig::parse(json).expect_err(json);
        for w in *want {
            assert!(e.contains(w), "{json}: `{w}` missing from: {e}");
        }
        assert!(!e.contains("`?`") && !e.contains("`.`"), "{json}: {e}");
    }
}

/// Through clap: the error names the flag too and stops before anything
/// loads.
#[test]
fn the_flag_reports_the_field() {
    use clap::Parser;
    let e = crate::cli::Cli::try_parse_from([
        "server",
        "--kv-events-config",
        r#"{"enable_kv_cache_events": true, "publisher": "kafka"}"#,
    ])
    .expect_err("refused");
    let msg = e.to_string();
    assert!(msg.contains("--kv-events-config"), "{msg}");
    assert!(msg.contains("`publisher`"), "{msg}");
    let ok = crate::cli::Cli::try_parse_from([
        "server",
        "--kv-events-config",
        r#"{"enable_kv_cache_events": true}"#,
    ])
    .expect("parses");
    assert!(ok
        .serve
        .engine
        .kv_events_config
        .as_ref()
        .is_some_and(KvEventsConfig::active));
}

/// An endpoint that is taken cannot be bound: startup fails naming it.
#[test]
fn a_taken_endpoint_is_a_startup_error() {
    let taken = std::net::TcpListener::bind("0.0.0.0:0").expect("bind");
    let port = taken.local_addr().unwrap().port();
    let cfg = KvEventsConfig::parse(&format!(
        r#"{{"enable_kv_cache_events": true, "endpoint": "tcp://*:{port}"}}"#
    ))
    .unwrap();
    let e = start(&cfg).err().expect("must fail");
    let msg = format!("{e:#}");
    assert!(
        msg.contains("`endpoint`") && msg.contains(&port.to_string()),
        "{msg}"
    );
    let cfg = KvEventsConfig::parse(&format!(
        r#"{{"enable_kv_cache_events": true, "endpoint": "tcp://*:0",
            "replay_endpoint": "tcp://*:{port}"}}"#
    ))
    .unwrap();
    let msg = format!("{:#}", start(&cfg).err().expect("must fail"));
    assert!(msg.contains("`replay_endpoint`"), "{msg}");
}

/// Two free TCP ports on this machine (a small race with other binders is
/// accepted in tests).
fn free_ports() -> (u16, u16) {
    // Both bound at once, so they differ.
    let a = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let b = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = |l: &std::net::TcpListener| l.local_addr().expect("addr").port();
    (port(&a), port(&b))
}

fn stored(hash: u128, tokens: &[u32]) -> engine::kv::KvEvent {
    engine::kv::KvEvent::BlockStored {
        block_hashes: vec![engine::kv::BlockHash(hash)],
        parent_block_hash: None,
        token_ids: tokens.to_vec(),
        block_size: tokens.len(),
        lora_id: None,
        medium: engine::kv::KvMedium::Gpu,
    }
}

/// The next message within 200 ms, as frames.
async fn recv(sub: &mut zeromq::SubSocket) -> Option<Vec<bytes::Bytes>> {
    use zeromq::SocketRecv;
    tokio::time::timeout(std::time::Duration::from_millis(200), sub.recv())
        .await
        .ok()
        .map(|m| m.expect("recv").into_vec())
}

fn seq_of(m: &[bytes::Bytes]) -> u64 {
    u64::from_be_bytes(m[1][..].try_into().expect("8 bytes"))
}

/// The real publisher and real zeromq sockets on loopback: a SUB socket sees
/// `[topic, seq, payload]` with consecutive numbers and the wire payload;
/// a DEALER asking the replay socket gets the buffered batches, then the
/// end marker.
#[test]
fn publishes_and_replays_over_tcp() {
    use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};
    let (port, replay_port) = free_ports();
    let cfg = KvEventsConfig::parse(&format!(
        r#"{{"enable_kv_cache_events": true, "endpoint": "tcp://*:{port}",
            "replay_endpoint": "tcp://*:{replay_port}", "topic": "kv@test"}}"#
    ))
    .unwrap();
    let mut sink = start(&cfg).expect("starts").expect("active");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let mut sub = SubSocket::new();
        sub.connect(&format!("tcp://127.0.0.1:{port}"))
            .await
            .expect("connect");
        sub.subscribe("kv@").await.expect("subscribe");
        // PUB drops until the subscription has arrived: publish until one
        // gets through (a slow joiner), at most 10 s.
        let mut published = 0u64;
        let first = loop {
            sink.publish(vec![stored(u128::from(published), &[1, 2])]);
            published += 1;
            if let Some(m) = recv(&mut sub).await {
                break m;
            }
            assert!(published < 50, "no message reached the subscriber");
        };
        assert_eq!(first.len(), 3);
        assert_eq!(&first[0][..], b"kv@test");
        let k = seq_of(&first);
        assert!(k < published);
        // Catch up with anything already on the way, then three more.
        let mut last = k;
        while last + 1 < published {
            last = seq_of(&recv(&mut sub).await.expect("in order"));
        }
        for i in 0..3u128 {
            sink.publish(vec![stored(1000 + i, &[7, 8])]);
        }
        for i in 0..3u64 {
            let m = recv(&mut sub).await.expect("published");
            assert_eq!(seq_of(&m), published + i, "consecutive numbers");
            let want =
                super::wire::encode_batch(0.0, &[stored(1000 + u128::from(i), &[7, 8])], Some(0));
            // Everything after the timestamp (array marker, 0xcb, 8 bytes).
            assert_eq!(&m[2][10..], &want[10..]);
            assert_eq!(m[2][1], 0xcb);
        }
        let total = published + 3;

        let mut dealer = DealerSocket::new();
        dealer
            .connect(&format!("tcp://127.0.0.1:{replay_port}"))
            .await
            .expect("connect replay");
        let from = total - 2;
        let mut req = ZmqMessage::from(bytes::Bytes::new());
        req.push_back(bytes::Bytes::copy_from_slice(&from.to_be_bytes()));
        dealer.send(req).await.expect("request");
        let mut seqs = Vec::new();
        loop {
            let m = tokio::time::timeout(std::time::Duration::from_secs(5), dealer.recv())
                .await
                .expect("replay answers")
                .expect("recv")
                .into_vec();
            assert_eq!(m.len(), 3, "[\"\", seq, payload]");
            assert!(m[0].is_empty());
            if m[1][..] == super::publisher::END_SEQ {
                assert!(m[2].is_empty());
                break;
            }
            seqs.push(seq_of(&m));
        }
        assert_eq!(seqs, vec![total - 2, total - 1]);
    });
}
