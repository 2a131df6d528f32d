//! Cutting text for tails and summaries without splitting a UTF-8 character.

/// The last `max` bytes of `s` at most, starting on a character boundary.
pub fn tail(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

#[cfg(test)]
mod tests {
    use super::tail;

    #[test]
    fn tails_keep_whole_characters() {
        assert_eq!(tail("hello", 10), "hello");
        assert_eq!(tail("hello", 3), "llo");
        // "é" is two bytes: a cut inside it moves forward to the next character.
        assert_eq!(tail("aé", 1), "");
        assert_eq!(tail("aéb", 2), "b");
    }
}
