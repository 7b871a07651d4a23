//! Prompt lookup decoding: proposals copied from the sequence itself.

/// Up to `k` tokens following the latest earlier occurrence of the last `n`
/// tokens of `tokens`, for the largest `n` in `min..=max` that has one.
/// Empty when no suffix of those lengths occurred before.
///
/// Cost: O(len x max) comparisons in the worst case.
pub fn propose_ngram(tokens: &[u32], min: usize, max: usize, k: usize) -> Vec<u32> {
    let len = tokens.len();
    if k == 0 || min == 0 {
        return Vec::new();
    }
    for n in (min..=max.min(len.saturating_sub(1))).rev() {
        let suffix = &tokens[len - n..];
        // Latest start `i < len - n` with tokens[i..i + n] == suffix.
        let found = (0..len - n).rev().find(|&i| &tokens[i..i + n] == suffix);
        if let Some(i) = found {
            let from = i + n;
            return tokens[from..(from + k).min(len)].to_vec();
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::propose_ngram;

    #[test]
    fn copies_what_followed_the_latest_match() {
        // "1 2 3 4 | 1 2 3 9 | 1 2 3": the latest "1 2 3" is followed by 9.
        let t = [1, 2, 3, 4, 1, 2, 3, 9, 7, 1, 2, 3];
        assert_eq!(propose_ngram(&t, 1, 3, 2), vec![9, 7]);
        // Bounded by k and by the end of the sequence.
        assert_eq!(propose_ngram(&t, 1, 3, 1), vec![9]);
        let t = [5, 6, 5];
        assert_eq!(propose_ngram(&t, 1, 2, 4), vec![6, 5]);
    }

    #[test]
    fn longest_suffix_wins() {
        // Suffix "8 1": the 2-gram occurs once (followed by 4); the 1-gram
        // "1" occurs later (followed by 5): the longer match is used.
        let t = [8, 1, 4, 0, 1, 5, 8, 1];
        assert_eq!(propose_ngram(&t, 1, 2, 1), vec![4]);
        assert_eq!(propose_ngram(&t, 1, 1, 1), vec![5]);
    }

    #[test]
    fn nothing_without_a_match() {
        assert!(propose_ngram(&[1, 2, 3], 1, 3, 3).is_empty());
        assert!(propose_ngram(&[1], 1, 3, 3).is_empty());
        assert!(propose_ngram(&[], 1, 3, 3).is_empty());
        // min above every match length.
        assert!(propose_ngram(&[1, 2, 1], 2, 3, 3).is_empty());
        assert!(propose_ngram(&[1, 2, 1], 1, 3, 0).is_empty());
    }
}
