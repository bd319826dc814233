//! Shell-style wildcard patterns (`fnmatch(3)` semantics) used by globbing,
//! `find -name/-path`, `grep --include` and ACL rules.

/// One element of a compiled pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Lit(char),
    Any,
    Star,
    /// `**` in ACL rule patterns: any sequence including `/`.
    DoubleStar,
    Class {
        negated: bool,
        items: Vec<ClassItem>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum ClassItem {
    Char(char),
    Range(char, char),
    Named(NamedClass),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NamedClass {
    Alpha,
    Digit,
    Alnum,
    Upper,
    Lower,
    Space,
    Blank,
    Punct,
    Print,
    Graph,
    Cntrl,
    Xdigit,
}

impl NamedClass {
    fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "alpha" => Self::Alpha,
            "digit" => Self::Digit,
            "alnum" => Self::Alnum,
            "upper" => Self::Upper,
            "lower" => Self::Lower,
            "space" => Self::Space,
            "blank" => Self::Blank,
            "punct" => Self::Punct,
            "print" => Self::Print,
            "graph" => Self::Graph,
            "cntrl" => Self::Cntrl,
            "xdigit" => Self::Xdigit,
            _ => return None,
        })
    }

    fn matches(self, c: char) -> bool {
        match self {
            Self::Alpha => c.is_alphabetic(),
            Self::Digit => c.is_ascii_digit(),
            Self::Alnum => c.is_alphanumeric(),
            Self::Upper => c.is_uppercase(),
            Self::Lower => c.is_lowercase(),
            Self::Space => c.is_whitespace(),
            Self::Blank => c == ' ' || c == '\t',
            Self::Punct => c.is_ascii_punctuation(),
            Self::Print => !c.is_control(),
            Self::Graph => !c.is_control() && !c.is_whitespace(),
            Self::Cntrl => c.is_control(),
            Self::Xdigit => c.is_ascii_hexdigit(),
        }
    }
}

/// Matching options, as the `FNM_*` flags of `fnmatch(3)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct MatchOptions {
    /// A leading `.` (of the string, or after `/` with `pathname`) must be matched literally.
    pub period: bool,
    /// Wildcards never match `/`.
    pub pathname: bool,
    /// Case-insensitive (`find -iname`).
    pub casefold: bool,
}

/// A compiled wildcard pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    toks: Vec<Tok>,
}

impl Pattern {
    /// Compile a pattern where `\` escapes the next character (fnmatch syntax).
    pub fn new(pat: &str) -> Self {
        let mut chars = Vec::new();
        let mut it = pat.chars();
        while let Some(c) = it.next() {
            if c == '\\' {
                match it.next() {
                    Some(n) => chars.push((n, true)),
                    None => chars.push(('\\', true)),
                }
            } else {
                chars.push((c, false));
            }
        }
        Self::from_chars(&chars, false)
    }

    /// Compile a pattern for ACL rules, where `**` matches across `/`.
    pub fn new_recursive(pat: &str) -> Self {
        let chars: Vec<(char, bool)> = pat.chars().map(|c| (c, false)).collect();
        Self::from_chars(&chars, true)
    }

    /// Compile from characters tagged "quoted" (quoted characters are literal).
    pub fn from_chars(chars: &[(char, bool)], double_star: bool) -> Self {
        let mut toks = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            let (c, quoted) = chars[i];
            if quoted {
                toks.push(Tok::Lit(c));
                i += 1;
                continue;
            }
            match c {
                '*' => {
                    if double_star && i + 1 < chars.len() && chars[i + 1] == ('*', false) {
                        // `**/` also matches zero directories.
                        toks.push(Tok::DoubleStar);
                        i += 2;
                        if i < chars.len() && chars[i] == ('/', false) {
                            toks.push(Tok::Lit('/'));
                            // Represent "**/" as optional: handled in matcher by DoubleStar
                            // followed by '/', tried with zero-length too.
                            i += 1;
                        }
                    } else {
                        if toks.last() != Some(&Tok::Star) {
                            toks.push(Tok::Star);
                        }
                        i += 1;
                    }
                }
                '?' => {
                    toks.push(Tok::Any);
                    i += 1;
                }
                '[' => match parse_class(chars, i + 1) {
                    Some((tok, next)) => {
                        toks.push(tok);
                        i = next;
                    }
                    None => {
                        toks.push(Tok::Lit('['));
                        i += 1;
                    }
                },
                _ => {
                    toks.push(Tok::Lit(c));
                    i += 1;
                }
            }
        }
        Pattern { toks }
    }

    /// True if the pattern contains any wildcard.
    pub fn has_wildcards(&self) -> bool {
        self.toks.iter().any(|t| !matches!(t, Tok::Lit(_)))
    }

    /// The literal text, if the pattern has no wildcards.
    pub fn literal(&self) -> Option<String> {
        self.toks
            .iter()
            .map(|t| match t {
                Tok::Lit(c) => Some(*c),
                _ => None,
            })
            .collect()
    }

    /// Match a whole string.
    pub fn matches(&self, s: &str, opts: MatchOptions) -> bool {
        let text: Vec<char> = s.chars().collect();
        match_here(&self.toks, &text, 0, 0, opts)
    }
}

fn parse_class(chars: &[(char, bool)], start: usize) -> Option<(Tok, usize)> {
    let mut i = start;
    let mut negated = false;
    if i < chars.len() && !chars[i].1 && (chars[i].0 == '!' || chars[i].0 == '^') {
        negated = true;
        i += 1;
    }
    let mut items = Vec::new();
    let mut first = true;
    loop {
        if i >= chars.len() {
            return None;
        }
        let (c, quoted) = chars[i];
        if c == ']' && !quoted && !first {
            return Some((Tok::Class { negated, items }, i + 1));
        }
        first = false;
        if c == '[' && !quoted && i + 1 < chars.len() && chars[i + 1].0 == ':' {
            // [:name:]
            let mut j = i + 2;
            let mut name = String::new();
            while j + 1 < chars.len() && !(chars[j].0 == ':' && chars[j + 1].0 == ']') {
                name.push(chars[j].0);
                j += 1;
            }
            if j + 1 < chars.len() {
                if let Some(nc) = NamedClass::parse(&name) {
                    items.push(ClassItem::Named(nc));
                    i = j + 2;
                    continue;
                }
            }
        }
        let (lo, next) = if c == '\\' && !quoted && i + 1 < chars.len() {
            (chars[i + 1].0, i + 2)
        } else {
            (c, i + 1)
        };
        if next + 1 < chars.len()
            && chars[next].0 == '-'
            && !chars[next].1
            && chars[next + 1].0 != ']'
        {
            let (hi, after) = if chars[next + 1].0 == '\\' && next + 2 < chars.len() {
                (chars[next + 2].0, next + 3)
            } else {
                (chars[next + 1].0, next + 2)
            };
            items.push(ClassItem::Range(lo, hi));
            i = after;
        } else {
            items.push(ClassItem::Char(lo));
            i = next;
        }
    }
}

fn class_matches(negated: bool, items: &[ClassItem], c: char, casefold: bool) -> bool {
    let test = |c: char| {
        items.iter().any(|it| match *it {
            ClassItem::Char(x) => x == c,
            ClassItem::Range(lo, hi) => lo <= c && c <= hi,
            ClassItem::Named(n) => n.matches(c),
        })
    };
    let mut hit = test(c);
    if !hit && casefold {
        hit = c.to_lowercase().any(test) || c.to_uppercase().any(test);
    }
    hit != negated
}

fn chars_eq(a: char, b: char, casefold: bool) -> bool {
    a == b || (casefold && a.to_lowercase().eq(b.to_lowercase()))
}

fn leading_period(text: &[char], ti: usize, opts: MatchOptions) -> bool {
    opts.period && text[ti] == '.' && (ti == 0 || (opts.pathname && text[ti - 1] == '/'))
}

fn match_here(toks: &[Tok], text: &[char], pi: usize, ti: usize, opts: MatchOptions) -> bool {
    let (mut pi, mut ti) = (pi, ti);
    while pi < toks.len() {
        match &toks[pi] {
            Tok::Lit(c) => {
                if ti >= text.len() || !chars_eq(*c, text[ti], opts.casefold) {
                    return false;
                }
                pi += 1;
                ti += 1;
            }
            Tok::Any => {
                if ti >= text.len()
                    || (opts.pathname && text[ti] == '/')
                    || leading_period(text, ti, opts)
                {
                    return false;
                }
                pi += 1;
                ti += 1;
            }
            Tok::Class { negated, items } => {
                if ti >= text.len()
                    || (opts.pathname && text[ti] == '/')
                    || leading_period(text, ti, opts)
                    || !class_matches(*negated, items, text[ti], opts.casefold)
                {
                    return false;
                }
                pi += 1;
                ti += 1;
            }
            Tok::Star => {
                if ti < text.len() && leading_period(text, ti, opts) {
                    // `*` may only match the empty string here.
                    return match_here(toks, text, pi + 1, ti, opts);
                }
                let mut end = ti;
                loop {
                    if match_here(toks, text, pi + 1, end, opts) {
                        return true;
                    }
                    if end >= text.len() || (opts.pathname && text[end] == '/') {
                        return false;
                    }
                    end += 1;
                }
            }
            Tok::DoubleStar => {
                // Followed by '/': may also match nothing at all (including the slash).
                if toks.get(pi + 1) == Some(&Tok::Lit('/'))
                    && match_here(toks, text, pi + 2, ti, opts)
                {
                    return true;
                }
                let mut end = ti;
                loop {
                    if match_here(toks, text, pi + 1, end, opts) {
                        return true;
                    }
                    if end >= text.len() {
                        return false;
                    }
                    end += 1;
                }
            }
        }
    }
    ti == text.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, s: &str) -> bool {
        Pattern::new(p).matches(s, MatchOptions::default())
    }

    #[test]
    fn basics() {
        assert!(m("*.md", "a.md"));
        assert!(m("*.md", ".a.md"));
        assert!(!m("*.md", "a.txt"));
        assert!(m("a?c", "abc"));
        assert!(m("[abc]x", "bx"));
        assert!(!m("[!abc]x", "bx"));
        assert!(m("[]]", "]"));
        assert!(m("[a-c]", "b"));
        assert!(m("[[:digit:]]*", "9lives"));
        assert!(m("\\*", "*"));
        assert!(!m("\\*", "a"));
        assert!(m("[", "["));
        assert!(m("*", ""));
    }

    #[test]
    fn period_and_pathname() {
        let o = MatchOptions {
            period: true,
            pathname: true,
            casefold: false,
        };
        assert!(!Pattern::new("*").matches(".hidden", o));
        assert!(Pattern::new(".*").matches(".hidden", o));
        assert!(!Pattern::new("a*b").matches("a/b", o));
        assert!(Pattern::new("a*b").matches("a/b", MatchOptions::default()));
    }

    #[test]
    fn casefold() {
        let o = MatchOptions {
            casefold: true,
            ..Default::default()
        };
        assert!(Pattern::new("*.MD").matches("x.md", o));
        assert!(Pattern::new("[A-C]x").matches("bX", o));
    }

    #[test]
    fn double_star() {
        let o = MatchOptions {
            pathname: true,
            ..Default::default()
        };
        let p = Pattern::new_recursive("internal/**");
        assert!(p.matches("internal/a/b.md", o));
        assert!(!p.matches("public/a.md", o));
        let p = Pattern::new_recursive("**/secret*.md");
        assert!(p.matches("secret1.md", o));
        assert!(p.matches("a/b/secret2.md", o));
        assert!(!p.matches("a/b/public.md", o));
    }
}
