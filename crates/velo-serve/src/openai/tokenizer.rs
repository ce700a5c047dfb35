//! The prompt tokenizer: a deliberately simple, documented stand-in for a model's tokenizer,
//! used only to count prompt tokens (the mock engine's prefill cost depends on the count).
//!
//! A token is a maximal run of alphanumeric characters (a word or a number), capped at
//! [`MAX_WORD_CHARS`] characters per token (a longer run counts once per started
//! [`MAX_WORD_CHARS`] characters, as subword tokenizers split long words), or any single other
//! non-whitespace character (punctuation, symbols). Whitespace is free. A chat request adds
//! [`TOKENS_PER_MESSAGE`] per message (role and delimiters) and [`REPLY_PRIMER_TOKENS`] for the
//! assistant's reply header, as chat templates do. English text comes out near 1.3 tokens per
//! word, close to common BPE tokenizers.

/// Longest run of alphanumeric characters counted as one token.
pub const MAX_WORD_CHARS: usize = 8;
/// Tokens a chat template adds per message.
pub const TOKENS_PER_MESSAGE: u32 = 3;
/// Tokens a chat template adds to open the assistant's reply.
pub const REPLY_PRIMER_TOKENS: u32 = 3;

/// The number of tokens in `text`.
pub fn count(text: &str) -> u64 {
    let mut tokens = 0u64;
    let mut word = 0usize;
    for c in text.chars() {
        if c.is_alphanumeric() {
            if word.is_multiple_of(MAX_WORD_CHARS) {
                tokens += 1;
            }
            word += 1;
        } else {
            word = 0;
            if !c.is_whitespace() {
                tokens += 1;
            }
        }
    }
    tokens
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_punctuation_and_long_words_are_counted_as_documented() {
        assert_eq!(count(""), 0);
        assert_eq!(count("   \n\t"), 0);
        assert_eq!(count("Hello, world!"), 4);
        assert_eq!(count("tokenization"), 2); // 12 characters: two started runs of 8
        assert_eq!(count("abcdefgh"), 1);
        assert_eq!(count("a-b"), 3);
        assert_eq!(count("x = 42;"), 4);
    }
}
