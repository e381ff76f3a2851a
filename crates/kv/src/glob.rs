//! Redis's glob patterns (KEYS, SCAN MATCH, CONFIG GET): `*` any run of bytes, `?` any byte,
//! `[abc]`, `[a-z]` and `[^a]` classes, `\x` the byte `x` itself. Matched with one backtracking
//! point per `*`, so a hostile pattern costs at most pattern length × text length steps.

/// Whether `text` matches `pattern`; `nocase` compares ASCII letters without case.
pub fn glob_match(pattern: &[u8], text: &[u8], nocase: bool) -> bool {
    let (mut p, mut t) = (0, 0);
    // Where the last `*` was and how much text it has taken so far.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if pattern.get(p) == Some(&b'*') {
            star = Some((p, t));
            p += 1;
            continue;
        }
        if let Some(next) = match_one(pattern, p, text[t], nocase) {
            p = next;
            t += 1;
            continue;
        }
        match star {
            Some((star_p, star_t)) => {
                star = Some((star_p, star_t + 1));
                p = star_p + 1;
                t = star_t + 1;
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|c| *c == b'*')
}

/// If the pattern element at `p` matches byte `c`, where the next element starts.
fn match_one(pattern: &[u8], p: usize, c: u8, nocase: bool) -> Option<usize> {
    let same = |a: u8, b: u8| a == b || (nocase && a.eq_ignore_ascii_case(&b));
    match *pattern.get(p)? {
        b'?' => Some(p + 1),
        b'\\' if p + 1 < pattern.len() => same(pattern[p + 1], c).then_some(p + 2),
        b'[' => {
            let mut i = p + 1;
            let negated = pattern.get(i) == Some(&b'^');
            if negated {
                i += 1;
            }
            let mut matched = false;
            // An unterminated class ends with the pattern, as in Redis.
            while i < pattern.len() && pattern[i] != b']' {
                if pattern[i] == b'\\' && i + 1 < pattern.len() {
                    matched |= same(pattern[i + 1], c);
                    i += 2;
                } else if i + 2 < pattern.len() && pattern[i + 1] == b'-' {
                    let (mut low, mut high) = (pattern[i], pattern[i + 2]);
                    if low > high {
                        std::mem::swap(&mut low, &mut high);
                    }
                    let folded = if nocase { c.to_ascii_lowercase() } else { c };
                    let (low, high) = if nocase {
                        (low.to_ascii_lowercase(), high.to_ascii_lowercase())
                    } else {
                        (low, high)
                    };
                    matched |= (low..=high).contains(&folded);
                    i += 3;
                } else {
                    matched |= same(pattern[i], c);
                    i += 1;
                }
            }
            (matched != negated).then_some((i + 1).min(pattern.len()))
        }
        literal => same(literal, c).then_some(p + 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_as_in_redis() {
        let yes = |p: &str, t: &str| glob_match(p.as_bytes(), t.as_bytes(), false);
        assert!(yes("*", "") && yes("*", "anything") && yes("h?llo", "hello"));
        assert!(yes("h*llo", "heeeello") && yes("h*llo", "hllo") && !yes("h*llo", "hell"));
        assert!(yes("h[ae]llo", "hallo") && !yes("h[ae]llo", "hillo"));
        assert!(yes("h[^e]llo", "hallo") && !yes("h[^e]llo", "hello"));
        assert!(yes("h[a-b]llo", "hbllo") && yes("h[b-a]llo", "hallo") && !yes("h[a-b]llo", "hcllo"));
        assert!(yes("a\\*b", "a*b") && !yes("a\\*b", "axb") && yes("[\\]]", "]"));
        assert!(yes("user:*:name", "user:42:name") && !yes("user:*:name", "user:42:names"));
        assert!(yes("*a*b*c*", "xxaxxbxxcxx") && !yes("*a*b*c*", "xxaxxcxxbxx"));
        assert!(!yes("abc", "ab") && !yes("ab", "abc") && yes("ab*", "ab"));
        assert!(glob_match(b"MAX*", b"maxmemory", true) && !glob_match(b"MAX*", b"maxmemory", false));
        // A pattern that takes exponential time when every `*` is retried at every position.
        let text = "a".repeat(5_000);
        assert!(!yes(&format!("{}b", "*a".repeat(50)), &text));
    }
}
