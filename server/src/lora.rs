//! LoRA adapters as the server knows them: names -> files -> loaded
//! weights, vLLM's interface (`--lora-modules`, `"model": NAME`,
//! `/v1/load_lora_adapter`, `/v1/unload_lora_adapter`).
//!
//! Invariants: an adapter name is never the base model's name and names
//! one adapter; every registered adapter was read and checked once
//! (`model_loader::lora::load_lora`) before it became visible, so a bad
//! adapter is refused whole and nothing already registered changes; each
//! registration gets a fresh [`LoraId`] (the engine's slot and prefix-cache
//! key), so an adapter unloaded and loaded again never meets blocks cached
//! for the old one. At most `max_cpu_loras` adapters keep their weights in
//! memory (least recently requested dropped first); a request for a dropped
//! one reads its files again under the same id.
//!
//! Cost: a registration or a reload reads the adapter (O(its elements));
//! a request for a loaded adapter is a map lookup under a mutex.

use crate::error::ApiError;
use engine::model::lora::LoraId;
use engine::scheduler::LoraRequest;
use model_loader::lora::{load_lora, LoraAdapter};
use model_loader::ModelConfig;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

/// One `--lora-modules` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraModule {
    pub name: String,
    pub path: PathBuf,
    /// vLLM's JSON form may state the parent; the base model when absent.
    pub base_model_name: Option<String>,
}

/// Parses `NAME=PATH` or vLLM's JSON `{"name", "path", "base_model_name"}`.
pub fn parse_lora_module(s: &str) -> Result<LoraModule, String> {
    let s = s.trim();
    if s.starts_with('{') {
        let v: serde_json::Value =
            serde_json::from_str(s).map_err(|e| format!("invalid JSON lora module: {e}"))?;
        let field = |k: &str| v.get(k).and_then(serde_json::Value::as_str);
        let name = field("name").ok_or("a JSON lora module needs \"name\"")?;
        let path = field("path").ok_or("a JSON lora module needs \"path\"")?;
        return Ok(LoraModule {
            name: name.to_string(),
            path: PathBuf::from(path),
            base_model_name: field("base_model_name").map(str::to_string),
        });
    }
    let (name, path) = s
        .split_once('=')
        .ok_or("expected NAME=PATH or a JSON object")?;
    if name.is_empty() || path.is_empty() {
        return Err("expected NAME=PATH with both parts non-empty".into());
    }
    Ok(LoraModule {
        name: name.to_string(),
        path: PathBuf::from(path),
        base_model_name: None,
    })
}

struct Entry {
    path: PathBuf,
    id: LoraId,
    parent: Option<String>,
    weights: Option<Arc<LoraAdapter>>,
    last_used: u64,
}

#[derive(Default)]
struct Inner {
    adapters: BTreeMap<String, Entry>,
    next_id: u32,
    clock: u64,
}

/// The served adapters.
pub struct LoraRegistry {
    config: ModelConfig,
    base_name: String,
    max_rank: usize,
    max_cpu_loras: usize,
    inner: Mutex<Inner>,
}

impl LoraRegistry {
    /// An empty registry for the base model `config` served as `base_name`.
    pub fn new(
        config: ModelConfig,
        base_name: String,
        max_rank: usize,
        max_cpu_loras: usize,
    ) -> Self {
        Self {
            config,
            base_name,
            max_rank,
            max_cpu_loras: max_cpu_loras.max(1),
            inner: Mutex::new(Inner {
                next_id: 1,
                ..Inner::default()
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self, name: &str, path: &Path) -> Result<Arc<LoraAdapter>, ApiError> {
        load_lora(path, &self.config, self.max_rank)
            .map(Arc::new)
            .map_err(|e| ApiError::LoraInvalid {
                name: name.to_string(),
                reason: engine::error::Report(&e).to_string(),
            })
    }

    /// Reads, checks and registers the adapter at `path` as `name`.
    /// Blocking (reads the files); nothing changes on an error.
    pub fn add(&self, name: &str, path: &Path, parent: Option<String>) -> Result<(), ApiError> {
        if name.is_empty() || name == self.base_name {
            return Err(ApiError::invalid(
                "lora_name",
                format!("{name:?} cannot name an adapter (it is empty or the base model's name)"),
            ));
        }
        if self.lock().adapters.contains_key(name) {
            return Err(ApiError::LoraAlreadyLoaded(name.to_string()));
        }
        let weights = self.read(name, path)?;
        let mut g = self.lock();
        if g.adapters.contains_key(name) {
            return Err(ApiError::LoraAlreadyLoaded(name.to_string()));
        }
        g.clock += 1;
        let (id, last_used) = (LoraId(g.next_id), g.clock);
        g.next_id += 1;
        g.adapters.insert(
            name.to_string(),
            Entry {
                path: path.to_path_buf(),
                id,
                parent,
                weights: Some(weights),
                last_used,
            },
        );
        self.trim(&mut g);
        tracing::info!(adapter = name, path = %path.display(), id = id.0, "LoRA adapter loaded");
        Ok(())
    }

    /// Forgets `name` (requests already running with it finish with it).
    pub fn remove(&self, name: &str) -> Result<(), ApiError> {
        match self.lock().adapters.remove(name) {
            Some(_) => {
                tracing::info!(adapter = name, "LoRA adapter unloaded");
                Ok(())
            }
            None => Err(ApiError::LoraNotFound(name.to_string())),
        }
    }

    /// Drops the weights of the least recently requested adapters beyond
    /// `max_cpu_loras` (their names stay registered).
    fn trim(&self, g: &mut Inner) {
        loop {
            let loaded: Vec<(&String, u64)> = g
                .adapters
                .iter()
                .filter(|(_, e)| e.weights.is_some())
                .map(|(n, e)| (n, e.last_used))
                .collect();
            if loaded.len() <= self.max_cpu_loras {
                return;
            }
            let Some(victim) = loaded
                .iter()
                .min_by_key(|(_, t)| *t)
                .map(|(n, _)| (*n).clone())
            else {
                return;
            };
            if let Some(e) = g.adapters.get_mut(&victim) {
                e.weights = None;
            }
        }
    }

    /// Whether `name` is a registered adapter.
    pub fn contains(&self, name: &str) -> bool {
        self.lock().adapters.contains_key(name)
    }

    /// The request's adapter for model name `name` (`None`: not an
    /// adapter). Reads the files again when its weights were dropped.
    pub fn request(&self, name: &str) -> Result<Option<LoraRequest>, ApiError> {
        let (id, path) = {
            let mut g = self.lock();
            g.clock += 1;
            let now = g.clock;
            let Some(e) = g.adapters.get_mut(name) else {
                return Ok(None);
            };
            e.last_used = now;
            if let Some(w) = &e.weights {
                return Ok(Some(LoraRequest {
                    id: e.id,
                    name: Arc::from(name),
                    adapter: Arc::clone(w),
                }));
            }
            (e.id, e.path.clone())
        };
        let weights = self.read(name, &path)?;
        let mut g = self.lock();
        if let Some(e) = g.adapters.get_mut(name).filter(|e| e.id == id) {
            e.weights = Some(Arc::clone(&weights));
        }
        self.trim(&mut g);
        Ok(Some(LoraRequest {
            id,
            name: Arc::from(name),
            adapter: weights,
        }))
    }

    /// `(name, path, parent)` of every adapter, by name.
    pub fn list(&self) -> Vec<(String, PathBuf, String)> {
        self.lock()
            .adapters
            .iter()
            .map(|(n, e)| {
                let parent = e.parent.clone().unwrap_or_else(|| self.base_name.clone());
                (n.clone(), e.path.clone(), parent)
            })
            .collect()
    }
}

/// The environment variable vLLM reads to allow runtime adapter updates.
pub const RUNTIME_UPDATING_ENV: &str = "VLLM_ALLOW_RUNTIME_LORA_UPDATING";

/// `--enable-lora` at startup: the registry with the `--lora-modules`
/// adapters (a bad one stops startup) and vLLM's runtime-updating switch.
pub fn setup(
    state: &mut crate::http::AppState,
    args: &crate::cli::lora::LoraArgs,
    config: ModelConfig,
) -> anyhow::Result<()> {
    if !args.enable_lora {
        if !args.lora_modules.is_empty() {
            anyhow::bail!("--lora-modules needs --enable-lora");
        }
        return Ok(());
    }
    let reg = LoraRegistry::new(
        config,
        state.served_model_name.clone(),
        args.max_lora_rank,
        args.cpu_loras(),
    );
    for m in &args.lora_modules {
        reg.add(&m.name, &m.path, m.base_model_name.clone())
            .map_err(|e| anyhow::anyhow!("--lora-modules {}: {e}", m.name))?;
    }
    state.loras = Some(Arc::new(reg));
    state.runtime_lora_updating =
        runtime_updating_allowed(std::env::var(RUNTIME_UPDATING_ENV).ok().as_deref());
    if state.runtime_lora_updating {
        tracing::warn!("runtime LoRA adapter updating is on ({RUNTIME_UPDATING_ENV})");
    }
    Ok(())
}

/// `POST /v1/load_lora_adapter`'s body (vLLM's `LoadLoRAAdapterRequest`).
#[derive(Debug, serde::Deserialize)]
pub struct LoadLoraRequest {
    pub lora_name: String,
    pub lora_path: String,
}

/// `POST /v1/unload_lora_adapter`'s body (vLLM's `UnloadLoRAAdapterRequest`).
#[derive(Debug, serde::Deserialize)]
pub struct UnloadLoraRequest {
    pub lora_name: String,
}

/// vLLM's `VLLM_ALLOW_RUNTIME_LORA_UPDATING`: `1` or `true` (any case)
/// turns the load/unload routes on.
pub fn runtime_updating_allowed(value: Option<&str>) -> bool {
    value.is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true"))
}

/// Loads an adapter at run time; vLLM's success text. Blocking.
pub fn load(reg: &LoraRegistry, r: &LoadLoraRequest) -> Result<String, ApiError> {
    if r.lora_name.is_empty() || r.lora_path.is_empty() {
        return Err(ApiError::invalid(
            "lora_name",
            "both 'lora_name' and 'lora_path' must be provided.",
        ));
    }
    reg.add(&r.lora_name, Path::new(&r.lora_path), None)?;
    Ok(format!(
        "Success: LoRA adapter '{}' added successfully.",
        r.lora_name
    ))
}

/// Unloads an adapter; vLLM's success text.
pub fn unload(reg: &LoraRegistry, r: &UnloadLoraRequest) -> Result<String, ApiError> {
    reg.remove(&r.lora_name)?;
    Ok(format!(
        "Success: LoRA adapter '{}' removed successfully.",
        r.lora_name
    ))
}

/// `/v1/models` entries of the adapters (vLLM: `root` is the adapter's
/// path, `parent` the base model).
pub fn model_cards(reg: &LoraRegistry, created: u64) -> Vec<serde_json::Value> {
    reg.list()
        .into_iter()
        .map(|(name, path, parent)| {
            serde_json::json!({
                "id": name, "object": "model", "created": created, "owned_by": "paged-engine",
                "root": path.display().to_string(), "parent": parent, "max_model_len": null,
            })
        })
        .collect()
}

/// `vllm:lora_requests_info` as vLLM defines it: a gauge whose value is the
/// time of the sample (seconds since the epoch) and whose labels carry
/// `max_lora` and the comma-joined adapter names of running and waiting
/// requests. Empty when adapters are off (vLLM has no such gauge then).
pub fn metric(state: &crate::http::AppState) -> String {
    if state.loras.is_none() {
        return String::new();
    }
    let n = state.backend.lora_names();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    format!(
        "# HELP vllm:lora_requests_info Running stats on lora requests.\n\
         # TYPE vllm:lora_requests_info gauge\n\
         vllm:lora_requests_info{{max_lora=\"{}\",waiting_lora_adapters=\"{}\",running_lora_adapters=\"{}\"}} {now}\n",
        n.max_loras,
        crate::metrics::escape(&n.waiting.join(",")),
        crate::metrics::escape(&n.running.join(",")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lora_module_forms() {
        assert_eq!(
            parse_lora_module("sql=/a/b").unwrap(),
            LoraModule {
                name: "sql".into(),
                path: "/a/b".into(),
                base_model_name: None
            }
        );
        let j =
            parse_lora_module(r#"{"name": "x", "path": "/p", "base_model_name": "m"}"#).unwrap();
        assert_eq!(j.base_model_name.as_deref(), Some("m"));
        assert!(parse_lora_module("nopath").is_err());
        assert!(parse_lora_module(r#"{"name": "x"}"#).is_err());
    }
}
