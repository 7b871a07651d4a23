use super::*;
use clap::error::ErrorKind;
use clap::CommandFactory;

#[test]
fn cli_is_consistent() {
    Cli::command().debug_assert();
}

fn parse(argv: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_checked(std::iter::once("server").chain(argv.iter().copied()))
}

#[test]
fn serve_is_the_default() {
    let c = parse(&["--port", "9001", "--max-num-seqs", "8"]).expect("parses");
    let Action::Serve(s) = c.into_action() else {
        panic!("serve expected")
    };
    assert_eq!(s.http.port, 9001);
    assert_eq!(s.engine.max_num_seqs, 8);
    let g = parse(&["generate", "--prompt", "hi", "--chat"]).expect("parses");
    assert!(matches!(g.into_action(), Action::Generate(_, ref a) if a.chat && a.prompt == "hi"));
    assert!(parse(&["--preemption-mode", "sometimes"]).is_err());
}

/// Engine flags land in the same place before and after the subcommand.
#[test]
fn engine_flags_work_on_both_sides_of_the_subcommand() {
    let flags = [
        "--model",
        "/m/x.gguf",
        "--max-num-seqs",
        "3",
        "--block-size",
        "8",
    ];
    let check = |e: &EngineArgs, how: &str| {
        assert_eq!(
            e.model.as_deref(),
            Some(std::path::Path::new("/m/x.gguf")),
            "{how}"
        );
        assert_eq!(e.max_num_seqs, 3, "{how}");
        assert_eq!(e.block_size, 8, "{how}");
    };
    for sub in [
        &["generate", "--prompt", "p"][..],
        &["serve", "--port", "7"][..],
    ] {
        let before: Vec<&str> = flags.iter().chain(sub).copied().collect();
        let after: Vec<&str> = sub.iter().chain(&flags).copied().collect();
        for (how, argv) in [("before", before), ("after", after)] {
            match parse(&argv).expect("parses").into_action() {
                Action::Generate(e, g) => {
                    check(&e, how);
                    assert_eq!(g.prompt, "p");
                }
                Action::Serve(s) => {
                    check(&s.engine, how);
                    assert_eq!(s.http.port, 7, "{how}");
                }
            }
        }
    }
}

/// HTTP flags written before a subcommand are an error, not a silent default.
#[test]
fn http_flags_before_a_subcommand_are_an_error() {
    for argv in [
        &["--port", "9", "serve"][..],
        &["--api-key", "k", "generate", "--prompt", "p"][..],
    ] {
        let e = parse(argv).expect_err("must be refused");
        assert_eq!(e.kind(), ErrorKind::ArgumentConflict, "{argv:?}: {e}");
    }
}

/// One bad value per numeric flag: (flag, bad value, the range the error and
/// the help must both state).
const BAD: &[(&str, &str, &str)] = &[
    ("--block-size", "0", "1..=256"),
    ("--block-size", "257", "1..=256"),
    ("--max-num-seqs", "0", ">= 1"),
    ("--max-num-batched-tokens", "0", ">= 1"),
    ("--max-model-len", "0", ">= 1"),
    ("--swap-space", "-1", ">= 0"),
    ("--kv-cache-memory", "-0.5", ">= 0"),
    ("--kv-cache-memory", "nan", ">= 0"),
    ("--num-gpu-blocks-override", "0", ">= 1"),
    ("--gpu-memory-utilization", "7", "(0, 1]"),
    ("--gpu-memory-utilization", "0", "(0, 1]"),
    ("--threads", "0", ">= 1"),
    ("--max-waiting-requests", "0", ">= 1"),
    ("--max-body-bytes", "0", ">= 1"),
    ("--stream-buffer", "0", ">= 1"),
    ("--port", "70000", "0..=65535"),
    ("--stream-stall-timeout", "0", "> 0"),
    ("--max-tokens", "0", ">= 1"),
];

fn is_http_flag(flag: &str) -> bool {
    matches!(
        flag,
        "--max-waiting-requests"
            | "--max-body-bytes"
            | "--stream-buffer"
            | "--stream-stall-timeout"
            | "--port"
    )
}

#[test]
fn every_bad_numeric_value_is_a_clap_error_naming_flag_and_range() {
    for &(flag, bad, range) in BAD {
        let value = format!("{flag}={bad}");
        let argv: Vec<&str> = if flag == "--max-tokens" {
            vec!["generate", "--prompt", "p", &value]
        } else if is_http_flag(flag) {
            vec!["serve", &value]
        } else {
            vec![&value]
        };
        let e = parse(&argv).expect_err(&format!("{value} must be refused"));
        assert_eq!(e.kind(), ErrorKind::ValueValidation, "{value}: {e}");
        let msg = e.to_string();
        assert!(msg.contains(flag), "{value}: no flag name in {msg}");
        assert!(msg.contains(range), "{value}: no range {range} in {msg}");
        // The same value written after `generate` (engine flags are global).
        if !is_http_flag(flag) && flag != "--max-tokens" {
            let e = parse(&["generate", "--prompt", "p", &value]).expect_err("refused");
            assert!(e.to_string().contains(range), "{value} after generate: {e}");
        }
    }
}

/// The help text of the command that owns `flag`.
fn help_of(flag: &str) -> String {
    let mut cmd = Cli::command();
    let sub = if flag == "--max-tokens" {
        Some("generate")
    } else {
        None
    };
    match sub {
        Some(s) => cmd
            .find_subcommand_mut(s)
            .expect("subcommand")
            .render_long_help()
            .to_string(),
        None => cmd.render_long_help().to_string(),
    }
}

#[test]
fn help_states_each_range() {
    for &(flag, _, range) in BAD {
        let help = help_of(flag);
        let start = help
            .find(&format!("{flag} "))
            .unwrap_or_else(|| panic!("{flag} missing in help:\n{help}"));
        // The flag's entry runs to the next flag.
        let entry = &help[start..];
        let end = entry[2..].find("\n  -").map_or(entry.len(), |i| i + 2);
        let entry = entry[..end]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            entry.contains(&format!("Range: {range}")),
            "{flag}: help entry lacks `Range: {range}`: {entry}"
        );
    }
}

#[test]
fn good_edge_values_parse() {
    let c = parse(&[
        "--block-size",
        "256",
        "--gpu-memory-utilization",
        "1",
        "--swap-space",
        "0",
        "--kv-cache-memory",
        "0",
        "--max-num-seqs",
        "1",
    ])
    .expect("edge values are valid");
    assert_eq!(c.serve.engine.block_size, 256);
    assert!((c.serve.engine.gpu_memory_utilization - 1.0).abs() < f64::EPSILON);
}

#[test]
fn async_scheduling_is_off_unless_asked() {
    let off = parse(&[]).expect("parses");
    let Action::Serve(s) = off.into_action() else {
        panic!("serve expected")
    };
    assert!(!s.engine.async_scheduling);
    let on = parse(&["--async-scheduling"]).expect("parses");
    let Action::Serve(s) = on.into_action() else {
        panic!("serve expected")
    };
    assert!(s.engine.async_scheduling);
}

#[test]
fn enforce_eager_reaches_the_executor_request() {
    use engine::engine_loop::HandleConfig;
    let eager = parse(&["--enforce-eager", "--max-num-seqs", "64"]).expect("parses");
    let opts = crate::app::engine_options(&eager.serve.engine, 2048, HandleConfig::default());
    assert!(opts.executor.enforce_eager);
    assert_eq!(opts.executor.max_num_seqs, 64);
    let default = parse(&[]).expect("parses");
    let opts = crate::app::engine_options(&default.serve.engine, 2048, HandleConfig::default());
    assert!(
        !opts.executor.enforce_eager,
        "CUDA graphs are on by default"
    );
}

#[test]
fn kv_cache_dtype_reaches_the_executor_request() {
    use engine::engine_loop::HandleConfig;
    use engine::model::KvDtype;
    let want = [
        (None, None),
        (Some("auto"), None),
        (Some("float16"), Some(KvDtype::F16)),
        (Some("fp16"), Some(KvDtype::F16)),
        (Some("float32"), Some(KvDtype::F32)),
    ];
    for (arg, kv) in want {
        let argv: Vec<&str> = arg.map_or(vec![], |a| vec!["--kv-cache-dtype", a]);
        let cli = parse(&argv).expect("parses");
        let opts = crate::app::engine_options(&cli.serve.engine, 2048, HandleConfig::default());
        assert_eq!(opts.executor.kv_cache_dtype, kv, "{arg:?}");
    }
    let Err(e) = parse(&["--kv-cache-dtype", "fp8"]) else {
        panic!("--kv-cache-dtype fp8 was accepted");
    };
    assert!(e.to_string().contains("kv-cache-dtype"), "{e}");
}
