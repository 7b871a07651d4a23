//! CORS with vLLM's flags (`--allowed-origins`, `--allowed-methods`,
//! `--allowed-headers`), off unless `--allowed-origins` is given.
//!
//! Each flag takes a JSON list as vLLM does (`'["https://a.example"]'`) or a
//! comma-separated list (`https://a.example,https://b.example`); `*` allows
//! any. With CORS on, a request whose `Origin` is allowed gets
//! `Access-Control-Allow-Origin` (`*` when any origin is allowed, else the
//! origin itself with `Vary: Origin`) on every answer, errors included; a
//! preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`)
//! is answered before routing and authentication: 200 with the allowed
//! methods and headers when origin, method and headers all pass, else 400
//! naming what was refused.
//!
//! Invariants: with CORS off no response carries a CORS header and
//! `OPTIONS` is an ordinary (405) request; a refused origin never gets an
//! `Access-Control-Allow-Origin`.
//!
//! Cost: O(list length) per request with an `Origin` header.

use hyper::header::{HeaderMap, HeaderValue};

/// A list flag's value: a JSON list of strings or a comma-separated list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorsList(pub Vec<String>);

impl CorsList {
    /// The clap value parser.
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let items: Vec<String> = if t.starts_with('[') {
            serde_json::from_str::<Vec<String>>(t)
                .map_err(|e| format!("not a JSON list of strings ({e})"))?
        } else {
            t.split(',').map(str::to_string).collect()
        };
        let items: Vec<String> = items
            .into_iter()
            .map(|i| i.trim().to_string())
            .filter(|i| !i.is_empty())
            .collect();
        if items.is_empty() {
            return Err("the list is empty".into());
        }
        Ok(Self(items))
    }

    fn any(&self) -> bool {
        self.0.iter().any(|i| i == "*")
    }
}

/// The CORS policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cors {
    pub origins: CorsList,
    pub methods: CorsList,
    pub headers: CorsList,
}

/// Methods announced when `--allowed-methods` is `*`.
const ALL_METHODS: &str = "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT";
/// How long a browser may cache a preflight answer, in seconds.
const MAX_AGE: &str = "600";

impl Cors {
    /// The policy from the flags: `None` (off) without `--allowed-origins`;
    /// methods and headers default to `*` as in vLLM.
    pub fn from_flags(
        origins: Option<CorsList>,
        methods: Option<CorsList>,
        headers: Option<CorsList>,
    ) -> Option<Self> {
        let star = || CorsList(vec!["*".into()]);
        origins.map(|origins| Self {
            origins,
            methods: methods.unwrap_or_else(star),
            headers: headers.unwrap_or_else(star),
        })
    }

    fn origin_allowed(&self, origin: &str) -> bool {
        self.origins.any() || self.origins.0.iter().any(|o| o == origin)
    }

    /// The `Origin` of a request when it is allowed.
    pub fn allowed_origin<'a>(&self, req: &'a HeaderMap) -> Option<&'a str> {
        let origin = req.get("origin")?.to_str().ok()?;
        self.origin_allowed(origin).then_some(origin)
    }

    /// Adds the CORS headers of an actual (non-preflight) answer to a request
    /// from `origin` (already allowed).
    pub fn decorate(&self, origin: &str, out: &mut HeaderMap) {
        if self.origins.any() {
            out.insert("access-control-allow-origin", HeaderValue::from_static("*"));
        } else if let Ok(v) = HeaderValue::from_str(origin) {
            out.insert("access-control-allow-origin", v);
            out.append("vary", HeaderValue::from_static("Origin"));
        }
    }

    /// Answers a preflight: `Ok(headers)` for a 200, `Err(reason)` for a 400.
    /// `None` when `req` is no preflight (no `Access-Control-Request-Method`).
    pub fn preflight(&self, req: &HeaderMap) -> Option<Result<HeaderMap, String>> {
        let method = req
            .get("access-control-request-method")?
            .to_str()
            .unwrap_or("");
        let origin = req.get("origin").and_then(|v| v.to_str().ok())?;
        let mut refused = Vec::new();
        if !self.origin_allowed(origin) {
            refused.push("origin");
        }
        if !(self.methods.any()
            || self
                .methods
                .0
                .iter()
                .any(|m| m.eq_ignore_ascii_case(method)))
        {
            refused.push("method");
        }
        let asked = req
            .get("access-control-request-headers")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let headers_ok = self.headers.any()
            || asked
                .split(',')
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .all(|h| self.headers.0.iter().any(|a| a.eq_ignore_ascii_case(h)));
        if !headers_ok {
            refused.push("headers");
        }
        if !refused.is_empty() {
            return Some(Err(format!("Disallowed CORS {}", refused.join(", "))));
        }
        let mut out = HeaderMap::new();
        self.decorate(origin, &mut out);
        let methods = if self.methods.any() {
            ALL_METHODS.to_string()
        } else {
            self.methods.0.join(", ")
        };
        let headers = if self.headers.any() {
            asked.to_string()
        } else {
            self.headers.0.join(", ")
        };
        for (k, v) in [
            ("access-control-allow-methods", methods),
            ("access-control-allow-headers", headers),
            ("access-control-max-age", MAX_AGE.to_string()),
        ] {
            if let Ok(v) = HeaderValue::from_str(&v) {
                out.insert(k, v);
            }
        }
        Some(Ok(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_as_json_or_commas() {
        let want = CorsList(vec!["http://a".into(), "http://b".into()]);
        assert_eq!(
            CorsList::parse(r#"["http://a", "http://b"]"#),
            Ok(want.clone())
        );
        assert_eq!(CorsList::parse("http://a, http://b"), Ok(want));
        assert!(CorsList::parse("[1, 2]").is_err());
        assert!(CorsList::parse(" , ").is_err());
    }
}
