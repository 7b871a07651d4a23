//! The deployment files under `deploy/` and the `Dockerfile`, checked
//! without Docker or a cluster: every YAML and JSON file parses, every
//! Kubernetes object has its identity, and the facts that tie the pieces
//! together hold:
//!
//! - the model server's probes are on `/health`, on the port it listens on
//!   (`--port`, `--host 0.0.0.0`), and its flags exist in `server/src/cli.rs`;
//! - every Service selects some pods and targets ports those pods declare;
//! - every `paged-engine:<tag>` image is a target of the Dockerfile, built
//!   under that name;
//! - the InferencePool selects the server's pods on the server's port and
//!   names an Endpoint Picker Service on the port it serves;
//! - smg routes `cache_aware` to the server's pods on the server's port.
//!
//! YAML is read with `yaml-rust2` (pure Rust, maintained; see
//! README.md, "Deploying") and turned into `serde_json::Value`s.

use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask has a parent folder")
        .to_path_buf()
}

/// One parsed document and where it came from.
struct Doc {
    file: PathBuf,
    value: Value,
}

impl Doc {
    fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or("")
    }
    fn name(&self) -> &str {
        self.value["metadata"]["name"].as_str().unwrap_or("")
    }
    fn dir(&self) -> &Path {
        self.file.parent().expect("a file has a folder")
    }
    fn what(&self) -> String {
        format!("{} {} ({})", self.kind(), self.name(), self.file.display())
    }
}

fn yaml_to_json(y: &yaml_rust2::Yaml) -> Value {
    use yaml_rust2::Yaml;
    match y {
        Yaml::Real(s) => s
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map_or_else(|| Value::String(s.clone()), Value::Number),
        Yaml::Integer(i) => Value::from(*i),
        Yaml::String(s) => Value::String(s.clone()),
        Yaml::Boolean(b) => Value::Bool(*b),
        Yaml::Array(a) => Value::Array(a.iter().map(yaml_to_json).collect()),
        Yaml::Hash(h) => Value::Object(
            h.iter()
                .map(|(k, v)| {
                    let key = match k {
                        Yaml::String(s) => s.clone(),
                        Yaml::Integer(i) => i.to_string(),
                        Yaml::Boolean(b) => b.to_string(),
                        other => panic!("unsupported mapping key {other:?}"),
                    };
                    (key, yaml_to_json(v))
                })
                .collect(),
        ),
        Yaml::Null => Value::Null,
        Yaml::Alias(_) | Yaml::BadValue => panic!("unsupported YAML node {y:?}"),
    }
}

/// Every document of a YAML stream (`---`-separated).
fn parse_yaml(text: &str, file: &Path) -> Vec<Value> {
    let docs = yaml_rust2::YamlLoader::load_from_str(text)
        .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    docs.iter().map(yaml_to_json).collect()
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            files_under(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// All documents of all YAML and JSON files under `deploy/`, each one
/// checked for a kind and a name; plus the number of files read.
fn load_deploy() -> (Vec<Doc>, usize) {
    let mut files = Vec::new();
    files_under(&root().join("deploy"), &mut files);
    let mut docs = Vec::new();
    let mut read = 0;
    for file in files {
        let ext = file.extension().and_then(|e| e.to_str()).unwrap_or("");
        let text =
            || std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let values =
            match ext {
                "yaml" | "yml" => parse_yaml(&text(), &file),
                "json" => vec![serde_json::from_str(&text())
                    .unwrap_or_else(|e| panic!("{}: {e}", file.display()))],
                _ => continue,
            };
        read += 1;
        assert!(!values.is_empty(), "{}: no document", file.display());
        for value in values {
            assert!(
                value.is_object(),
                "{}: a document is not a mapping",
                file.display()
            );
            let doc = Doc {
                file: file.clone(),
                value,
            };
            assert!(
                doc.value["apiVersion"].is_string() && !doc.kind().is_empty(),
                "{}: a document without apiVersion or kind",
                file.display()
            );
            if doc.kind() != "Kustomization" {
                assert!(!doc.name().is_empty(), "{}: no metadata.name", doc.what());
            }
            docs.push(doc);
        }
    }
    (docs, read)
}

/// The stage names (`FROM ... AS name`) of the Dockerfile.
fn dockerfile_targets(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            match words.as_slice() {
                [from, _, as_, name]
                    if from.eq_ignore_ascii_case("FROM") && as_.eq_ignore_ascii_case("AS") =>
                {
                    Some(name.to_string())
                }
                _ => None,
            }
        })
        .collect()
}

/// A port given as a number or a numeric string.
fn port_number(v: &Value) -> Option<i64> {
    v.as_i64().or_else(|| v.as_str()?.parse().ok())
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|x| match x {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The value after `flag` in an argument list (`--flag value` or `--flag=value`).
fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter().enumerate().find_map(|(i, a)| {
        if a == flag {
            args.get(i + 1).map(String::as_str)
        } else {
            a.strip_prefix(flag)?.strip_prefix('=')
        }
    })
}

/// The containers of a workload's pod template.
fn containers(doc: &Value) -> Vec<&Value> {
    doc["spec"]["template"]["spec"]["containers"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

fn pod_labels(doc: &Value) -> &serde_json::Map<String, Value> {
    doc["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .expect("a pod template has labels")
}

/// Whether `labels` has every key/value of `selector`.
fn selects(
    selector: &serde_json::Map<String, Value>,
    labels: &serde_json::Map<String, Value>,
) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The number of a container port given by name or number, if declared.
fn resolve_port(container: &Value, port: &Value) -> Option<i64> {
    let ports = container["ports"].as_array()?;
    match port {
        Value::String(name) if name.parse::<i64>().is_err() => ports
            .iter()
            .find(|p| p["name"].as_str() == Some(name))
            .and_then(|p| p["containerPort"].as_i64()),
        other => {
            let n = port_number(other)?;
            ports
                .iter()
                .any(|p| p["containerPort"].as_i64() == Some(n))
                .then_some(n)
        }
    }
}

fn image_tag(image: &str) -> Option<&str> {
    image.strip_prefix("paged-engine:")
}

/// A model-server container: the server image, CPU or CUDA.
fn is_server(container: &Value) -> bool {
    matches!(
        container["image"].as_str().and_then(image_tag),
        Some("cpu" | "cuda")
    )
}

/// The long flags `server` accepts, read from its clap definitions: each
/// `pub field_name:` of `server/src/cli.rs` is `--field-name`.
fn server_flags() -> BTreeSet<String> {
    let cli = std::fs::read_to_string(root().join("server/src/cli.rs")).expect("server/src/cli.rs");
    cli.lines()
        .filter_map(|l| {
            let rest = l.trim().strip_prefix("pub ")?;
            let (field, _) = rest.split_once(':')?;
            field
                .chars()
                .all(|c| c.is_ascii_lowercase() || c == '_')
                .then(|| format!("--{}", field.replace('_', "-")))
        })
        .collect()
}

/// The server's arguments: `serve` first, listening on all interfaces, only
/// flags the server has. Returns the `--port` value.
fn check_server_args(args: &[String], what: &str, flags: &BTreeSet<String>) -> i64 {
    assert_eq!(
        args.first().map(String::as_str),
        Some("serve"),
        "{what}: args must start with `serve`"
    );
    assert_eq!(
        flag_value(args, "--host"),
        Some("0.0.0.0"),
        "{what}: --host 0.0.0.0"
    );
    for a in args.iter().filter(|a| a.starts_with("--")) {
        let flag = a.split('=').next().unwrap_or(a);
        assert!(
            flags.contains(flag),
            "{what}: `{flag}` is not a flag of server/src/cli.rs"
        );
    }
    flag_value(args, "--port")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{what}: no --port"))
}

/// Every kustomization's resources exist, and its inline patches parse.
/// Returns the parsed patches.
fn check_kustomizations(docs: &[Doc]) -> Vec<Doc> {
    let mut patches = Vec::new();
    for k in docs.iter().filter(|d| d.kind() == "Kustomization") {
        let resources = strings(&k.value["resources"]);
        assert!(!resources.is_empty(), "{}: no resources", k.what());
        for r in resources {
            let p = k.dir().join(&r);
            assert!(
                p.is_file() || p.join("kustomization.yaml").is_file(),
                "{}: resource {r} does not exist",
                k.what()
            );
        }
        for patch in k.value["patches"].as_array().into_iter().flatten() {
            if let Some(text) = patch["patch"].as_str() {
                for value in parse_yaml(text, &k.file) {
                    patches.push(Doc {
                        file: k.file.clone(),
                        value,
                    });
                }
            }
        }
    }
    patches
}

#[test]
fn deploy_files_parse_and_agree() {
    let (docs, files) = load_deploy();
    assert!(files >= 8, "expected the deploy/ tree, read {files} files");
    let flags = server_flags();
    assert!(
        flags.contains("--port") && flags.contains("--kv-cache-memory"),
        "reading server/src/cli.rs"
    );

    // Images and Dockerfile targets.
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).expect("Dockerfile");
    let targets = dockerfile_targets(&dockerfile);
    let patches = check_kustomizations(&docs);
    let mut tags = BTreeSet::new();
    for d in docs.iter().chain(&patches) {
        for c in containers(&d.value) {
            if let Some(image) = c["image"].as_str() {
                if let Some(tag) = image_tag(image) {
                    tags.insert(tag.to_string());
                }
            }
        }
        for img in d.value["images"].as_array().into_iter().flatten() {
            if img["name"].as_str() == Some("paged-engine") {
                tags.insert(img["newTag"].as_str().expect("newTag").to_string());
            }
        }
    }
    assert_eq!(
        tags,
        ["cpu", "cuda", "smg"].map(String::from).into(),
        "the images the manifests use"
    );
    let words = dockerfile.split_whitespace().collect::<Vec<_>>().join(" ");
    for tag in &tags {
        assert!(
            targets.contains(tag),
            "paged-engine:{tag} is not a Dockerfile target ({targets:?})"
        );
        let build = format!("--target {tag} -t paged-engine:{tag}");
        assert!(
            words.contains(&build),
            "the Dockerfile does not document `{build}`"
        );
    }

    // The model server: probes, ports, flags.
    let workloads: Vec<&Doc> = docs
        .iter()
        .filter(|d| matches!(d.kind(), "Deployment" | "StatefulSet"))
        .collect();
    let servers: Vec<&Doc> = workloads
        .iter()
        .copied()
        .filter(|d| containers(&d.value).iter().any(|c| is_server(c)))
        .collect();
    assert!(!servers.is_empty(), "no Deployment runs the server");
    let mut server_port = None;
    for s in &servers {
        assert!(
            s.value["spec"]["replicas"].as_i64().unwrap_or(1) >= 2,
            "{}: N >= 2 replicas",
            s.what()
        );
        for c in containers(&s.value).into_iter().filter(|c| is_server(c)) {
            let port = check_server_args(&strings(&c["args"]), &s.what(), &flags);
            assert!(
                resolve_port(c, &Value::from(port)).is_some(),
                "{}: --port {port} is not a containerPort",
                s.what()
            );
            for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
                let get = &c[probe]["httpGet"];
                if probe != "startupProbe" || !c[probe].is_null() {
                    assert_eq!(
                        get["path"].as_str(),
                        Some("/health"),
                        "{}: {probe} path",
                        s.what()
                    );
                    assert_eq!(
                        resolve_port(c, &get["port"]),
                        Some(port),
                        "{}: {probe} port",
                        s.what()
                    );
                }
            }
            server_port = Some(port);
        }
    }
    let server_port = server_port.expect("a server port");
    let server_labels = pod_labels(&servers[0].value);
    // Overlay patches that replace the server's arguments keep the port.
    for p in &patches {
        for c in containers(&p.value) {
            if c["name"].as_str() == Some("server") && c["args"].is_array() {
                let port = check_server_args(&strings(&c["args"]), &p.what(), &flags);
                assert_eq!(port, server_port, "{}: the patch moves --port", p.what());
            }
        }
    }

    // Services select pods and target ports those pods declare.
    for svc in docs.iter().filter(|d| d.kind() == "Service") {
        let selector = svc.value["spec"]["selector"]
            .as_object()
            .expect("a Service selector");
        let backends: Vec<&&Doc> = workloads
            .iter()
            .filter(|w| selects(selector, pod_labels(&w.value)))
            .collect();
        assert!(!backends.is_empty(), "{}: selects no workload", svc.what());
        for port in svc.value["spec"]["ports"]
            .as_array()
            .expect("Service ports")
        {
            for w in &backends {
                assert!(
                    containers(&w.value)
                        .iter()
                        .any(|c| resolve_port(c, &port["targetPort"]).is_some()),
                    "{}: targetPort {} is not a port of {}",
                    svc.what(),
                    port["targetPort"],
                    w.what()
                );
            }
        }
    }

    // Gateway API Inference Extension.
    let pools: Vec<&Doc> = docs
        .iter()
        .filter(|d| d.kind() == "InferencePool")
        .collect();
    assert_eq!(pools.len(), 1, "one InferencePool example");
    for pool in &pools {
        let spec = &pool.value["spec"];
        assert_eq!(
            pool.value["apiVersion"],
            "inference.networking.k8s.io/v1",
            "{}",
            pool.what()
        );
        let sel = spec["selector"]["matchLabels"]
            .as_object()
            .expect("selector.matchLabels");
        assert!(
            selects(sel, server_labels),
            "{}: does not select the server's pods",
            pool.what()
        );
        let ports: Vec<i64> = spec["targetPorts"]
            .as_array()
            .expect("targetPorts")
            .iter()
            .map(|p| p["number"].as_i64().expect("targetPorts[].number"))
            .collect();
        assert_eq!(ports, [server_port], "{}: targetPorts", pool.what());
        let epp = &spec["endpointPickerRef"];
        let epp_port = epp["port"]["number"]
            .as_i64()
            .expect("endpointPickerRef.port.number");
        let epp_svc = docs
            .iter()
            .find(|d| {
                d.kind() == "Service"
                    && d.name() == epp["name"].as_str().unwrap_or("")
                    && d.dir() == pool.dir()
            })
            .unwrap_or_else(|| panic!("{}: no Service {}", pool.what(), epp["name"]));
        assert!(
            epp_svc.value["spec"]["ports"]
                .as_array()
                .expect("ports")
                .iter()
                .any(|p| p["port"].as_i64() == Some(epp_port)),
            "{}: the EPP Service has no port {epp_port}",
            pool.what()
        );
        let epp_deploy = workloads
            .iter()
            .find(|w| w.dir() == pool.dir() && w.name() == epp_svc.name())
            .expect("the EPP Deployment");
        let args = strings(&containers(&epp_deploy.value)[0]["args"]);
        assert_eq!(
            flag_value(&args, "--pool-name"),
            Some(pool.name()),
            "{}",
            epp_deploy.what()
        );
        let routes: Vec<&Doc> = docs
            .iter()
            .filter(|d| d.kind() == "HTTPRoute" && d.dir() == pool.dir())
            .collect();
        assert!(
            routes
                .iter()
                .any(|r| r.value["spec"]["rules"][0]["backendRefs"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(
                        |b| b["kind"] == "InferencePool" && b["name"].as_str() == Some(pool.name())
                    )),
            "no HTTPRoute sends to {}",
            pool.what()
        );
    }

    // smg in front, cache-aware, discovering the server's pods.
    let smg: Vec<&&Doc> = workloads
        .iter()
        .filter(|w| {
            containers(&w.value)
                .iter()
                .any(|c| c["image"] == "paged-engine:smg")
        })
        .collect();
    assert_eq!(smg.len(), 1, "one smg Deployment");
    let args = strings(&containers(&smg[0].value)[0]["args"]);
    let what = smg[0].what();
    assert_eq!(flag_value(&args, "--policy"), Some("cache_aware"), "{what}");
    assert_eq!(
        flag_value(&args, "--health-check-endpoint"),
        Some("/health"),
        "{what}"
    );
    assert_eq!(
        flag_value(&args, "--service-discovery-port").and_then(|p| p.parse().ok()),
        Some(server_port),
        "{what}: discovered workers' port"
    );
    let (key, value) = flag_value(&args, "--selector")
        .and_then(|s| s.split_once('='))
        .unwrap_or_else(|| panic!("{what}: --selector key=value"));
    assert_eq!(
        server_labels.get(key).and_then(Value::as_str),
        Some(value),
        "{what}: --selector"
    );
}

#[test]
fn dockerfile_stages_are_read() {
    let t = dockerfile_targets("FROM a AS builder\nfrom ${X} as cpu\nFROM scratch\nRUN x AS y\n");
    assert_eq!(t, ["builder", "cpu"].map(String::from).into());
}

#[test]
fn yaml_streams_become_json() {
    let docs = parse_yaml(
        "a: 1\nb: [x, \"8000\"]\n---\nc: {d: true}\n",
        Path::new("t.yaml"),
    );
    assert_eq!(docs.len(), 2);
    assert_eq!(docs[0], serde_json::json!({"a": 1, "b": ["x", "8000"]}));
    assert_eq!(docs[1]["c"]["d"], true);
    assert_eq!(port_number(&docs[0]["b"][1]), Some(8000));
    let args: Vec<String> = ["--port=8000", "--policy", "cache_aware"]
        .map(String::from)
        .into();
    assert_eq!(flag_value(&args, "--port"), Some("8000"));
    assert_eq!(flag_value(&args, "--policy"), Some("cache_aware"));
    assert_eq!(flag_value(&args, "--host"), None);
}
