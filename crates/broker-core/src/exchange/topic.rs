//! Topic matching: binding keys of dot-separated words where `*` is exactly one word and `#` is
//! zero or more words.

/// Whether `routing_key` matches the topic binding `pattern`.
///
/// Iterative with one backtracking point per `#` (the classic wildcard algorithm), so a hostile
/// pattern such as `#.#.#.#.x` costs time linear in the product of the word counts at worst and
/// never recursion depth.
pub fn topic_matches(pattern: &[u8], routing_key: &[u8]) -> bool {
    let pattern_words: Vec<&[u8]> = pattern.split(|byte| *byte == b'.').collect();
    let key_words: Vec<&[u8]> = if routing_key.is_empty() { Vec::new() } else { routing_key.split(|byte| *byte == b'.').collect() };
    let pattern_words: Vec<&[u8]> = if pattern.is_empty() { Vec::new() } else { pattern_words };
    let (mut p, mut k) = (0usize, 0usize);
    // Where to resume after the last `#`: (pattern index after it, key index it has absorbed up to).
    let mut backtrack: Option<(usize, usize)> = None;
    loop {
        if p < pattern_words.len() && pattern_words[p] == b"#" {
            backtrack = Some((p + 1, k));
            p += 1;
            continue;
        }
        if k == key_words.len() && p == pattern_words.len() {
            return true;
        }
        if p < pattern_words.len() && k < key_words.len() && (pattern_words[p] == b"*" || pattern_words[p] == key_words[k]) {
            p += 1;
            k += 1;
            continue;
        }
        match backtrack {
            Some((resume_pattern, absorbed)) if absorbed < key_words.len() => {
                backtrack = Some((resume_pattern, absorbed + 1));
                p = resume_pattern;
                k = absorbed + 1;
            }
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::topic_matches;

    #[test]
    fn star_is_exactly_one_word() {
        assert!(topic_matches(b"a.*.c", b"a.b.c"));
        assert!(!topic_matches(b"a.*.c", b"a.c"));
        assert!(!topic_matches(b"a.*.c", b"a.b.b.c"));
        assert!(!topic_matches(b"*", b""));
    }

    #[test]
    fn hash_is_zero_or_more_words() {
        assert!(topic_matches(b"#", b""));
        assert!(topic_matches(b"#", b"a.b.c"));
        assert!(topic_matches(b"a.#", b"a"));
        assert!(topic_matches(b"a.#", b"a.b.c"));
        assert!(topic_matches(b"#.c", b"a.b.c"));
        assert!(topic_matches(b"a.#.c", b"a.c"));
        assert!(topic_matches(b"a.#.c", b"a.x.y.c"));
        assert!(!topic_matches(b"a.#.c", b"a.x.y"));
        assert!(topic_matches(b"#.#.x", b"x"));
        assert!(topic_matches(b"*.#", b"a"));
        assert!(!topic_matches(b"*.#", b""));
    }

    #[test]
    fn literal_words_and_empty_keys() {
        assert!(topic_matches(b"", b""));
        assert!(!topic_matches(b"", b"a"));
        assert!(topic_matches(b"a.b", b"a.b"));
        assert!(!topic_matches(b"a.b", b"a.bb"));
        assert!(topic_matches(b"a..b", b"a..b"));
    }
}
