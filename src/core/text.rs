//! Substring search for the core's few text scans (answer bodies, dates, URLs).
//!
//! Not `str::find` with a `&str` pattern: on wasm32 that is std's two-way searcher,
//! about 1 KB of the gzipped module for needles of a few bytes. The haystacks are
//! bounded (an answer body is read to at most 64 KiB), so a plain scan is enough.

/// The byte offset of the first `needle` in `hay` (`Some(0)` for an empty needle).
pub fn find(hay: &str, needle: &str) -> Option<usize> {
    let (h, n) = (hay.as_bytes(), needle.as_bytes());
    if n.is_empty() {
        return Some(0);
    }
    h.windows(n.len()).position(|w| w == n)
}

/// `s[from..to]` without a panic path: every caller slices at char boundaries it found
/// itself, and a wrong index reads as empty rather than bringing std's slicing panic
/// (its message formats the string with `Debug`: 2 KB of the gzipped module, issue 36).
pub fn span(s: &str, from: usize, to: usize) -> &str {
    s.get(from..to).unwrap_or_default()
}

/// `s[from..]`, as [`span`].
pub fn tail(s: &str, from: usize) -> &str {
    s.get(from..).unwrap_or_default()
}

/// Whether `hay` contains `needle`.
pub fn contains(hay: &str, needle: &str) -> bool {
    find(hay, needle).is_some()
}

/// Where `needle` starts in `hay`, matches not overlapping: `str::match_indices`'s
/// offsets.
pub fn match_starts<'a>(hay: &'a str, needle: &'a str) -> impl Iterator<Item = usize> + 'a {
    let mut from = Some(0);
    std::iter::from_fn(move || {
        let start = from?;
        let at = start + find(tail(hay, start), needle)?;
        // An empty needle matches at every character boundary, the end included.
        let step = if needle.is_empty() {
            tail(hay, at).chars().next().map_or(1, char::len_utf8)
        } else {
            needle.len()
        };
        from = (at + step <= hay.len()).then_some(at + step);
        Some(at)
    })
}

/// `s` in double quotes as `{:?}` writes it, for the reasons the outbox gives: `"`,
/// `\\` and ASCII control characters escaped. Not `{:?}` itself: it brings std's
/// Unicode escaping tables into the module (0.5 KB gzipped); a non-ASCII character
/// here is written as it is (`{:?}` escapes the few it deems unprintable).
pub fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\0' => out.push_str("\\0"),
            c if c.is_ascii_control() => {
                out.push_str("\\u{");
                // Lower-case hex without leading zeros, as `{:?}` writes it.
                let n = u32::from(c);
                let digit = |d: u32| char::from_digit(d, 16).unwrap_or('0');
                if n >= 0x10 {
                    out.push(digit(n >> 4));
                }
                out.push(digit(n & 0xf));
                out.push('}');
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `span` and `tail` slice as `s[from..to]` and `s[from..]` do, and where those
    /// would panic (past the end, inside a character, reversed) give the empty string.
    #[test]
    fn span_and_tail_slice_without_a_panic() {
        let s = "aé✓z";
        for from in 0..=s.len() + 1 {
            assert_eq!(tail(s, from), s.get(from..).unwrap_or(""), "{from}..");
            for to in 0..=s.len() + 1 {
                assert_eq!(
                    span(s, from, to),
                    s.get(from..to).unwrap_or(""),
                    "{from}..{to}"
                );
            }
        }
        assert_eq!(span(s, 1, 3), "é");
        assert_eq!(tail(s, 3), "✓z");
        assert_eq!(tail(s, 2), "");
        assert_eq!(span(s, 0, 2), "");
        assert_eq!(span(s, 3, 1), "");
    }

    #[test]
    fn quotes_as_debug_does_for_ascii() {
        let all_ascii: String = (0u8..128).map(char::from).collect();
        for s in [
            "",
            "FLUSH",
            "a\"b\\c",
            "tab\there\nnew\r\0",
            "\u{1b}[31m\u{7f}",
            &all_ascii,
            "é ü 漢",
        ] {
            assert_eq!(quoted(s), format!("{s:?}"), "{s}");
        }
    }

    #[test]
    fn finds_as_str_find_does() {
        for (hay, needle) in [
            ("", ""),
            ("", "a"),
            ("abc", ""),
            ("abc", "abc"),
            ("abc", "abcd"),
            ("a-->b-->", "-->"),
            ("Sun, 06 Nov 1994", ", "),
            ("https://h/p", "://"),
            ("ééx", "x"),
            ("aab", "ab"),
            ("aaaa", "aa"),
            ("x_code code", "code"),
            ("é", ""),
        ] {
            assert_eq!(find(hay, needle), hay.find(needle), "{hay:?} {needle:?}");
            assert_eq!(contains(hay, needle), hay.contains(needle));
            let std: Vec<usize> = hay.match_indices(needle).map(|(at, _)| at).collect();
            assert_eq!(
                match_starts(hay, needle).collect::<Vec<_>>(),
                std,
                "{hay:?} {needle:?}"
            );
        }
    }
}
