//! Chat templates (Jinja, as in HF `tokenizer_config.json` or GGUF
//! `tokenizer.chat_template`) rendered with minijinja the way HF
//! transformers does: `trim_blocks` and `lstrip_blocks` on, Python string
//! methods through minijinja-contrib's pycompat, and the variables
//! `messages`, `add_generation_prompt`, `bos_token`, `eos_token` plus the
//! function `raise_exception(msg)`.
//!
//! Invariant: a [`ChatTemplate`] always holds a template that compiled;
//! rendering errors (including `raise_exception`) come back as
//! [`LoaderError::ChatTemplate`]. Rendering cost is the template's.

use minijinja::{context, Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::error::{LoaderError, Result};

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    /// A message with the given role.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("source_len", &self.source.len())
            .finish()
    }
}

impl Clone for ChatTemplate {
    fn clone(&self) -> Self {
        // The source compiled once already, so compiling it again cannot fail;
        // fall back to an environment without the template just in case.
        Self::new(&self.source, &self.bos_token, &self.eos_token).unwrap_or_else(|_| Self {
            env: Environment::new(),
            source: self.source.clone(),
            bos_token: self.bos_token.clone(),
            eos_token: self.eos_token.clone(),
        })
    }
}

fn raise_exception(msg: String) -> std::result::Result<String, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

fn template_err(e: Error) -> LoaderError {
    LoaderError::ChatTemplate(e)
}

impl ChatTemplate {
    /// Compiles `source` with the model's BOS/EOS token strings.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        minijinja_contrib::add_to_environment(&mut env);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned("chat", source.to_string())
            .map_err(template_err)?;
        Ok(Self {
            env,
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// Renders the conversation; with `add_generation_prompt` the output
    /// ends with the assistant turn's opening.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let tmpl = self.env.get_template("chat").map_err(template_err)?;
        tmpl.render(context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        })
        .map_err(template_err)
    }

    /// The template source.
    pub fn source(&self) -> &str {
        &self.source
    }
}
