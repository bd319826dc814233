//! Translate POSIX basic/extended regular expressions (with GNU extensions)
//! into the `regex` crate's syntax. Errors use GNU grep's wording.

/// Which POSIX dialect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Basic,
    Extended,
}

fn push_lit(out: &mut String, c: char) {
    if regex_syntax::is_meta_character(c) {
        out.push('\\');
    }
    out.push(c);
}

fn class_for(name: &str) -> Option<&'static str> {
    Some(match name {
        "alpha" => r"\p{Alphabetic}",
        "digit" => "0-9",
        "alnum" => r"\p{Alphabetic}\p{Nd}",
        "upper" => r"\p{Uppercase}",
        "lower" => r"\p{Lowercase}",
        "space" => r"\s",
        "blank" => r" \t\p{Zs}",
        "punct" => r"!-/:-@\[-`{-~\p{P}\p{S}",
        "print" => r"\P{C}",
        "graph" => r"\P{C}&&\S",
        "cntrl" => r"\p{Cc}",
        "xdigit" => "0-9A-Fa-f",
        _ => return None,
    })
}

fn push_class_char(out: &mut String, c: char) {
    if matches!(c, '\\' | '[' | ']' | '^' | '-' | '&' | '~') || c.is_whitespace() {
        out.push('\\');
        if c.is_whitespace() && c != ' ' {
            // Escaped whitespace must be written as an escape sequence.
            out.pop();
            out.push_str(&format!("\\x{{{:x}}}", c as u32));
            return;
        }
    }
    out.push(c);
}

/// Translate a bracket expression starting after `[`; returns the new index.
fn bracket(p: &[char], mut i: usize, out: &mut String) -> Result<usize, String> {
    const UNMATCHED: &str = "Unmatched [, [^, [:, [., or [=";
    let start = i;
    if i >= p.len() || (p[i] == '^' && i + 1 >= p.len()) {
        return Err("Invalid regular expression".into());
    }
    let mut negated = false;
    if i < p.len() && p[i] == '^' {
        negated = true;
        i += 1;
    }
    let mut items = String::new();
    let mut graph_hack = false;
    let mut first = true;
    loop {
        if i >= p.len() {
            return Err(UNMATCHED.into());
        }
        let c = p[i];
        if c == ']' && !first {
            i += 1;
            break;
        }
        first = false;
        // [:class:], [=c=], [.c.]
        if c == '[' && i + 1 < p.len() && matches!(p[i + 1], ':' | '=' | '.') {
            let kind = p[i + 1];
            let mut j = i + 2;
            while j + 1 < p.len() && !(p[j] == kind && p[j + 1] == ']') {
                j += 1;
            }
            if j + 1 >= p.len() {
                return Err(UNMATCHED.into());
            }
            let name: String = p[i + 2..j].iter().collect();
            match kind {
                ':' => match class_for(&name) {
                    Some(cls) if name == "graph" => {
                        graph_hack = true;
                        items.push_str(cls);
                    }
                    Some(cls) => items.push_str(cls),
                    None => return Err("Invalid character class name".into()),
                },
                _ => {
                    let mut cs = name.chars();
                    match (cs.next(), cs.next()) {
                        (Some(ch), None) => push_class_char(&mut items, ch),
                        _ => return Err("Invalid collation character".into()),
                    }
                }
            }
            i = j + 2;
            continue;
        }
        // Range?
        if i + 2 < p.len() && p[i + 1] == '-' && p[i + 2] != ']' {
            let hi = p[i + 2];
            if hi < c {
                return Err("Invalid range end".into());
            }
            push_class_char(&mut items, c);
            items.push('-');
            push_class_char(&mut items, hi);
            i += 3;
            continue;
        }
        push_class_char(&mut items, c);
        i += 1;
    }
    let _ = start;
    if graph_hack {
        // `[[:graph:]x]`: intersection syntax cannot mix; approximate graph as \S.
        items = items.replace(r"\P{C}&&\S", r"\S");
    }
    out.push('[');
    if negated {
        out.push('^');
    }
    out.push_str(&items);
    out.push(']');
    Ok(i)
}

/// Parse an interval body starting after `{` (ERE) or `\{` (BRE). Returns
/// (min, max, index after the closing brace) or None if not a valid interval.
fn interval(p: &[char], i: usize, basic: bool) -> Option<(u32, Option<u32>, usize)> {
    let mut j = i;
    let num = |j: &mut usize| -> Option<u32> {
        let s = *j;
        while *j < p.len() && p[*j].is_ascii_digit() {
            *j += 1;
        }
        if *j == s {
            None
        } else {
            p[s..*j].iter().collect::<String>().parse().ok()
        }
    };
    let min = num(&mut j);
    let max = if j < p.len() && p[j] == ',' {
        j += 1;
        num(&mut j)
    } else {
        Some(min?)
    };
    let close = if basic {
        if j + 1 < p.len() && p[j] == '\\' && p[j + 1] == '}' {
            j + 2
        } else {
            return None;
        }
    } else if j < p.len() && p[j] == '}' {
        j + 1
    } else {
        return None;
    };
    Some((min.unwrap_or(0), max, close))
}

/// Translate one pattern.
pub(crate) fn translate(pat: &str, dialect: Dialect) -> Result<String, String> {
    let p: Vec<char> = pat.chars().collect();
    let basic = dialect == Dialect::Basic;
    let mut out = String::with_capacity(pat.len() + 8);
    let mut depth = 0usize;
    // True where a `*` (and in ERE `+ ? {`) would have nothing to repeat.
    let mut at_start = true;
    let mut i = 0;
    while i < p.len() {
        let c = p[i];
        let was_start = at_start;
        at_start = false;
        match c {
            '\\' => {
                i += 1;
                let Some(&n) = p.get(i) else {
                    return Err("Trailing backslash".into());
                };
                match n {
                    '(' if basic => {
                        out.push('(');
                        depth += 1;
                        at_start = true;
                    }
                    ')' if basic => {
                        if depth == 0 {
                            return Err("Unmatched ) or \\)".into());
                        }
                        depth -= 1;
                        out.push(')');
                    }
                    '|' if basic => {
                        out.push('|');
                        at_start = true;
                    }
                    '{' if basic => {
                        if was_start {
                            push_lit(&mut out, '{');
                            continue;
                        }
                        match interval(&p, i + 1, true) {
                            Some((min, max, next)) => {
                                if max.is_some_and(|m| m < min) {
                                    return Err("Invalid content of \\{\\}".into());
                                }
                                match max {
                                    Some(m) => out.push_str(&format!("{{{min},{m}}}")),
                                    None => out.push_str(&format!("{{{min},}}")),
                                }
                                i = next - 1;
                            }
                            None => {
                                if p[i + 1..].windows(2).any(|w| w == ['\\', '}']) {
                                    return Err("Invalid content of \\{\\}".into());
                                }
                                return Err("Unmatched \\{".into());
                            }
                        }
                    }
                    '+' | '?' if basic => {
                        if was_start {
                            push_lit(&mut out, n);
                        } else {
                            out.push(n);
                        }
                    }
                    '<' => out.push_str(r"\b{start}"),
                    '>' => out.push_str(r"\b{end}"),
                    'b' => out.push_str(r"\b"),
                    'B' => out.push_str(r"\B"),
                    'w' | 'W' | 's' | 'S' => {
                        out.push('\\');
                        out.push(n);
                    }
                    '`' => out.push_str(r"\A"),
                    '\'' => out.push_str(r"\z"),
                    '1'..='9' => {
                        return Err("back-references are not supported by the virtual shell".into());
                    }
                    other => push_lit(&mut out, other),
                }
            }
            '[' => {
                i = bracket(&p, i + 1, &mut out)?;
                continue;
            }
            '.' => out.push('.'),
            '*' => {
                if was_start {
                    push_lit(&mut out, '*');
                    at_start = false;
                } else if out.ends_with('*') && !out.ends_with("\\*") {
                    // GNU accepts stacked repetition (`a**` is `a*`); the regex crate does not.
                } else {
                    out.push('*');
                }
            }
            '^' => {
                if !basic || was_start {
                    out.push('^');
                    at_start = true;
                } else {
                    push_lit(&mut out, '^');
                }
            }
            '$' => {
                let at_end = i + 1 == p.len()
                    || (basic
                        && p.get(i + 1) == Some(&'\\')
                        && matches!(p.get(i + 2), Some(')') | Some('|')));
                if !basic || at_end {
                    out.push('$');
                } else {
                    push_lit(&mut out, '$');
                }
            }
            '(' if !basic => {
                out.push('(');
                depth += 1;
                at_start = true;
            }
            ')' if !basic => {
                if depth == 0 {
                    push_lit(&mut out, ')');
                } else {
                    depth -= 1;
                    out.push(')');
                }
            }
            '|' if !basic => {
                out.push('|');
                at_start = true;
            }
            '+' | '?' if !basic => {
                if was_start {
                    push_lit(&mut out, c);
                } else {
                    out.push(c);
                }
            }
            '{' if !basic => {
                if was_start {
                    push_lit(&mut out, '{');
                } else {
                    match interval(&p, i + 1, false) {
                        Some((min, max, next)) => {
                            if max.is_some_and(|m| m < min) {
                                return Err("Invalid content of \\{\\}".into());
                            }
                            match max {
                                Some(m) => out.push_str(&format!("{{{min},{m}}}")),
                                None => out.push_str(&format!("{{{min},}}")),
                            }
                            i = next;
                            continue;
                        }
                        None => push_lit(&mut out, '{'),
                    }
                }
            }
            other => push_lit(&mut out, other),
        }
        i += 1;
    }
    if depth > 0 {
        return Err("Unmatched ( or \\(".into());
    }
    Ok(out)
}

/// GNU grep rejects `[:space:]` outside a bracket expression.
pub(crate) fn check_class_syntax(pat: &str) -> Result<(), String> {
    let b = pat.as_bytes();
    if b.len() >= 4
        && b[0] == b'['
        && b[1] == b':'
        && b[b.len() - 2] == b':'
        && b[b.len() - 1] == b']'
    {
        let name = &pat[2..pat.len() - 2];
        if class_for(name).is_some() {
            return Err(format!(
                "character class syntax is [[:{name}:]], not [:{name}:]"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bre(p: &str) -> String {
        translate(p, Dialect::Basic).unwrap()
    }

    fn ere(p: &str) -> String {
        translate(p, Dialect::Extended).unwrap()
    }

    fn m(re: &str, s: &str) -> bool {
        regex::Regex::new(re).unwrap().is_match(s)
    }

    #[test]
    fn basic_syntax() {
        assert_eq!(bre("a.c"), "a.c");
        assert!(m(&bre(r"\(ab\)\{2\}"), "abab"));
        assert!(m(&bre("a+b"), "a+b"));
        assert!(!m(&bre("a+b"), "aab"));
        assert!(m(&bre(r"a\+b"), "aab"));
        assert!(m(&bre("*a"), "*a"));
        assert!(m(&bre("a|b"), "a|b"));
        assert!(m(&bre(r"foo\|bar"), "bar"));
        assert!(m(&bre("a^b$c"), "a^b$c"));
        assert!(m(&bre("^ab$"), "ab"));
        assert!(m(&bre(r"\<word\>"), "a word here"));
        assert!(!m(&bre(r"\<word\>"), "swordfish"));
    }

    #[test]
    fn extended_syntax() {
        assert!(m(&ere("rat(e|s)"), "rats"));
        assert!(m(&ere("a{2}"), "aa"));
        assert!(m(&ere("a{x"), "a{x"));
        assert!(m(&ere("a)"), "a)"));
        assert!(m(&ere("^(a|b)+$"), "abba"));
    }

    #[test]
    fn brackets() {
        assert!(m(&bre("[]a]"), "]"));
        assert!(m(&bre("[^]a]"), "b"));
        assert!(m(&bre(r"[\]"), "\\"));
        assert!(m(&bre("[[:digit:]]x"), "5x"));
        assert!(m(&bre("[a-c-]"), "-"));
        assert!(m(&bre("[&~]"), "~"));
        assert!(m(&bre("[[:alpha:]]"), "\u{e9}"));
    }

    #[test]
    fn gnu_errors() {
        assert_eq!(
            translate("[a", Dialect::Basic).unwrap_err(),
            "Unmatched [, [^, [:, [., or [="
        );
        assert_eq!(
            translate(r"\(a", Dialect::Basic).unwrap_err(),
            "Unmatched ( or \\("
        );
        assert_eq!(
            translate("(a", Dialect::Extended).unwrap_err(),
            "Unmatched ( or \\("
        );
        assert_eq!(
            translate(r"a\)", Dialect::Basic).unwrap_err(),
            "Unmatched ) or \\)"
        );
        assert_eq!(
            translate(r"a\{1", Dialect::Basic).unwrap_err(),
            "Unmatched \\{"
        );
        assert_eq!(
            translate("[[:foo:]]", Dialect::Basic).unwrap_err(),
            "Invalid character class name"
        );
        assert_eq!(
            translate("a\\", Dialect::Basic).unwrap_err(),
            "Trailing backslash"
        );
        assert!(check_class_syntax("[:space:]").is_err());
    }
}
