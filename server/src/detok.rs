//! Incremental detokenization and stop strings.
//!
//! [`IncrementalDetokenizer`] turns token ids into text from each token's raw
//! bytes and emits only complete UTF-8: a multi-byte character split across
//! tokens is held until its last byte arrives; bytes that can never become
//! valid UTF-8 are emitted as U+FFFD. Special tokens (EOS, ...) are skipped,
//! as vLLM's `skip_special_tokens=True` does.
//!
//! [`StopMatcher`] finds stop strings in the generated text and never lets
//! them, or anything after them, out: text that could be the start of a stop
//! string is held back until it is known not to be one.
//!
//! Invariants: the concatenation of everything emitted equals the final text
//! (truncated before the first stop string); no emitted chunk splits a char.
//! Cost per token: O(token bytes) for the detokenizer; O(held text x number
//! of stop strings x longest stop string) for the matcher, where the held
//! text is bounded by the longest stop string plus the new chunk.

/// Where token bytes come from (the real tokenizer in the server).
pub trait TokenBytes {
    /// Raw bytes of `id`; `None` outside the vocabulary.
    fn token_bytes(&self, id: u32) -> Option<Vec<u8>>;
    /// Whether `id` is a control token to leave out of the text.
    fn is_special(&self, id: u32) -> bool;
}

impl TokenBytes for model_loader::Tokenizer {
    fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        model_loader::Tokenizer::token_bytes(self, id)
    }
    fn is_special(&self, id: u32) -> bool {
        model_loader::Tokenizer::is_special(self, id)
    }
}

/// Token ids in, complete UTF-8 text out.
#[derive(Debug, Default, Clone)]
pub struct IncrementalDetokenizer {
    pending: Vec<u8>,
}

impl IncrementalDetokenizer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one token; returns the text that became complete.
    pub fn push(&mut self, vocab: &dyn TokenBytes, id: u32) -> String {
        if vocab.is_special(id) {
            return String::new();
        }
        match vocab.token_bytes(id) {
            Some(b) => self.pending.extend_from_slice(&b),
            None => self.pending.extend_from_slice("\u{FFFD}".as_bytes()),
        }
        self.drain(false)
    }

    /// Emits whatever is held (incomplete characters become U+FFFD).
    pub fn flush(&mut self) -> String {
        self.drain(true)
    }

    fn drain(&mut self, all: bool) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (good, tail) = rest.split_at(e.valid_up_to());
                    // `good` is valid UTF-8 by construction.
                    out.push_str(std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            rest = &tail[bad..];
                        }
                        None if all => {
                            out.push('\u{FFFD}');
                            rest = &[];
                            break;
                        }
                        None => {
                            rest = tail;
                            break;
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }
}

/// What [`StopMatcher::push`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopOutcome {
    /// Text safe to emit now.
    pub text: String,
    /// A stop string was found; the sequence is done.
    pub stopped: bool,
}

/// Holds back text that may begin a stop string.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    stopped: bool,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops,
            held: String::new(),
            stopped: false,
        }
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Adds generated text; returns what may be emitted.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        if self.stopped {
            return StopOutcome {
                text: String::new(),
                stopped: true,
            };
        }
        self.held.push_str(text);
        if let Some(pos) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            self.stopped = true;
            let out = self.held[..pos].to_string();
            self.held.clear();
            return StopOutcome {
                text: out,
                stopped: true,
            };
        }
        let keep = self.partial_suffix_len();
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        StopOutcome {
            text: out,
            stopped: false,
        }
    }

    /// The rest of the text once the sequence ended without a stop string.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Longest suffix of `held` (at a char boundary) that is a proper prefix
    /// of some stop string.
    fn partial_suffix_len(&self) -> usize {
        let mut best = 0;
        for (start, _) in self.held.char_indices() {
            let suffix = &self.held[start..];
            if self.stops.iter().any(|s| s.starts_with(suffix)) {
                best = suffix.len();
                break;
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte table standing in for a vocabulary (pure-logic test of the
    /// UTF-8 handling; the HTTP tests use the real tokenizer).
    struct Table(Vec<Vec<u8>>);
    impl TokenBytes for Table {
        fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
            self.0.get(id as usize).cloned()
        }
        fn is_special(&self, id: u32) -> bool {
            id == 99
        }
    }

    #[test]
    fn never_splits_a_character() {
        // "é" is C3 A9; "😀" is F0 9F 98 80.
        let t = Table(vec![
            b"a".to_vec(),
            vec![0xC3],
            vec![0xA9],
            vec![0xF0, 0x9F],
            vec![0x98],
            vec![0x80],
        ]);
        let mut d = IncrementalDetokenizer::new();
        assert_eq!(d.push(&t, 0), "a");
        assert_eq!(d.push(&t, 1), "");
        assert_eq!(d.push(&t, 2), "é");
        assert_eq!(d.push(&t, 3), "");
        assert_eq!(d.push(&t, 4), "");
        assert_eq!(d.push(&t, 5), "😀");
        assert_eq!(d.push(&t, 99), "", "special tokens are skipped");
        assert_eq!(d.flush(), "");
    }

    #[test]
    fn invalid_bytes_become_replacement() {
        let t = Table(vec![vec![0xFF, b'x'], vec![0xE2, 0x82]]);
        let mut d = IncrementalDetokenizer::new();
        assert_eq!(d.push(&t, 0), "\u{FFFD}x");
        assert_eq!(d.push(&t, 1), "");
        assert_eq!(d.flush(), "\u{FFFD}");
        assert_eq!(d.push(&t, 7), "\u{FFFD}", "unknown id");
    }

    #[test]
    fn stop_string_is_never_emitted() {
        let mut m = StopMatcher::new(vec!["STOP".into()]);
        let a = m.push("hello S");
        assert_eq!(
            a,
            StopOutcome {
                text: "hello ".into(),
                stopped: false
            }
        );
        let b = m.push("TO");
        assert_eq!(b.text, "");
        let c = m.push("P and more");
        assert_eq!(
            c,
            StopOutcome {
                text: String::new(),
                stopped: true
            }
        );
        assert_eq!(m.push("x").text, "");
    }

    #[test]
    fn held_text_released_when_not_a_stop() {
        let mut m = StopMatcher::new(vec!["ab".into(), "xyz".into()]);
        assert_eq!(m.push("1a").text, "1");
        assert_eq!(m.push("c").text, "ac");
        assert_eq!(m.push("xy").text, "");
        assert_eq!(m.flush(), "xy");
    }

    #[test]
    fn earliest_stop_wins_and_text_before_is_kept() {
        let mut m = StopMatcher::new(vec!["world".into(), "lo".into()]);
        let o = m.push("hello world");
        assert_eq!(
            o,
            StopOutcome {
                text: "hel".into(),
                stopped: true
            }
        );
    }

    #[test]
    fn multibyte_holdback_respects_boundaries() {
        let mut m = StopMatcher::new(vec!["éx".into()]);
        assert_eq!(m.push("aé").text, "a");
        assert_eq!(m.push("é").text, "é");
        let o = m.push("x!");
        assert_eq!(
            o,
            StopOutcome {
                text: String::new(),
                stopped: true
            }
        );
    }
}
