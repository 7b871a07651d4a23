//! Chat templates: ChatML (SmolLM2's, as shipped in its GGUF), Llama-3 and
//! Qwen2 (the public templates from their tokenizer_config.json files).

use model_loader::{ChatMessage, ChatTemplate, LoaderError};

const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

const LLAMA3: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

const QWEN2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

fn msgs() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "  Hi there \n"),
        ChatMessage::new("assistant", "Hello!"),
        ChatMessage::new("user", "2+2?"),
    ]
}

#[test]
fn chatml_smollm2() {
    let t = ChatTemplate::new(SMOLLM2, "<|im_start|>", "<|im_end|>").unwrap();
    let out = t.render(&[ChatMessage::new("user", "Hi")], true).unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let out = t.render(&msgs(), false).unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n  Hi there \n<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
    );
}

#[test]
fn llama3() {
    let t = ChatTemplate::new(LLAMA3, "<|begin_of_text|>", "<|eot_id|>").unwrap();
    let out = t.render(&msgs()[..2], true).unwrap();
    assert_eq!(
        out,
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    );
}

#[test]
fn qwen2() {
    let t = ChatTemplate::new(QWEN2, "", "<|im_end|>").unwrap();
    let out = t.render(&[ChatMessage::new("user", "Hi")], true).unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn raise_exception_python_methods_and_whitespace_control() {
    let src = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}\n{% for m in messages %}\n  {{ m.content.strip().upper() }}{{ eos_token }}\n{% endfor %}";
    let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
    assert_eq!(
        t.render(&[ChatMessage::new("user", " a ")], false).unwrap(),
        "  A</s>\n"
    );
    let err = t
        .render(&[ChatMessage::new("system", "x")], false)
        .unwrap_err();
    // The template's own message is in the typed source chain.
    let mut chain = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        chain.push_str(&format!(": {s}"));
        source = s.source();
    }
    assert!(
        matches!(&err, LoaderError::ChatTemplate(_))
            && chain.contains("Conversation must start with user"),
        "{chain}"
    );
    assert!(matches!(
        ChatTemplate::new("{% for %}", "", ""),
        Err(LoaderError::ChatTemplate(_))
    ));
}
