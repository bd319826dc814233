//! The index's full-text tokenizer (SQLite FTS5 `porter unicode61`, default options) re-done in
//! Rust, so that hybrid search can tell which query terms a candidate chunk contains from the
//! chunk's text instead of one FTS query per term.
//!
//! It follows SQLite's code (`fts5_tokenize.c`) byte for byte: unicode61 splits on everything
//! that is not a letter, number or private-use character (combining diacritics continue a
//! token but do not start one), folds case and removes diacritics (`remove_diacritics=1`); the
//! porter stemmer then stems tokens of 3 to 64 bytes. ASCII and Latin-1 are tabulated here;
//! every other character is classified once per process by SQLite's own unicode61 tokenizer
//! (an in-memory FTS5 table), so no Unicode table is copied. Text whose answer could still
//! differ (a probe that fails, a token beyond FTS5's 32 KiB term limit) is reported as
//! [`Unsupported`]: the caller asks FTS itself then, so the answer is always the index's own.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

/// The text has a character this module does not reproduce the FTS tokenizer for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unsupported;

/// How unicode61 (default options) treats one character of U+0000..=U+00FF: `None` for a
/// separator, else the folded character (lower case, diacritic removed).
fn fold_latin1(c: char) -> Option<char> {
    match c {
        '0'..='9' | 'a'..='z' => Some(c),
        'A'..='Z' => Some(c.to_ascii_lowercase()),
        // Letters and numbers of Latin-1 (categories Lo, Ll, No): kept.
        '\u{aa}' | '\u{ba}' | '\u{b2}' | '\u{b3}' | '\u{b9}' | '\u{bc}'..='\u{be}' => Some(c),
        // MICRO SIGN folds to GREEK SMALL LETTER MU.
        '\u{b5}' => Some('\u{3bc}'),
        // Upper case letters fold to lower case (U+00D7 MULTIPLICATION SIGN is a separator).
        '\u{c0}'..='\u{de}' if c != '\u{d7}' => fold_latin1(char::from_u32(c as u32 + 32)?),
        // Lower case letters lose their diacritic where SQLite's table has one.
        '\u{e0}'..='\u{e5}' => Some('a'),
        '\u{e7}' => Some('c'),
        '\u{e8}'..='\u{eb}' => Some('e'),
        '\u{ec}'..='\u{ef}' => Some('i'),
        '\u{f1}' => Some('n'),
        '\u{f2}'..='\u{f6}' => Some('o'),
        '\u{f9}'..='\u{fc}' => Some('u'),
        '\u{fd}' | '\u{ff}' => Some('y'),
        // æ, ð, ø, þ, ß: letters without a decomposition, unchanged.
        '\u{df}'..='\u{ff}' if c != '\u{f7}' => Some(c),
        _ => None,
    }
}

/// How unicode61 treats a character.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CharClass {
    /// Ends a token.
    Separator,
    /// Starts or continues a token, as this (folded) character or as nothing.
    Token(Option<char>),
    /// Continues a token but does not start one (a combining diacritic), as this character or
    /// as nothing.
    Continue(Option<char>),
}

fn class_latin1(c: char) -> CharClass {
    match fold_latin1(c) {
        Some(f) => CharClass::Token(Some(f)),
        None => CharClass::Separator,
    }
}

/// Classes of characters above U+00FF learned from SQLite (`None`: the probe failed).
static LEARNED: LazyLock<Mutex<HashMap<char, Option<CharClass>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// An in-memory FTS5 table with the unicode61 tokenizer and its token instances.
static PROBE: LazyLock<Mutex<Option<rusqlite::Connection>>> = LazyLock::new(|| {
    let db = rusqlite::Connection::open_in_memory().ok().and_then(|db| {
        db.execute_batch(
            "CREATE VIRTUAL TABLE p USING fts5(x, tokenize = 'unicode61');
             CREATE VIRTUAL TABLE pv USING fts5vocab(p, 'instance');",
        )
        .ok()
        .map(|()| db)
    });
    Mutex::new(db)
});

/// Asks SQLite's unicode61 tokenizer how it treats each of `chars`: `q{c}q` shows whether `c`
/// continues a token and as what, `{c}q` whether it starts one.
fn probe(chars: &[char]) -> Vec<Option<CharClass>> {
    let guard = PROBE.lock().unwrap_or_else(|p| p.into_inner());
    let Some(db) = guard.as_ref() else {
        return vec![None; chars.len()];
    };
    let run = || -> rusqlite::Result<Vec<Option<CharClass>>> {
        let tx = db.unchecked_transaction()?;
        {
            let mut ins = tx.prepare("INSERT INTO p(rowid, x) VALUES (?1, ?2)")?;
            for (i, c) in chars.iter().enumerate() {
                ins.execute(rusqlite::params![2 * i as i64, format!("q{c}q")])?;
                ins.execute(rusqlite::params![2 * i as i64 + 1, format!("{c}q")])?;
            }
        }
        let mut toks: Vec<Vec<String>> = vec![Vec::new(); 2 * chars.len()];
        {
            let mut st = tx.prepare("SELECT doc, term FROM pv ORDER BY doc, offset")?;
            let mut rows = st.query([])?;
            while let Some(r) = rows.next()? {
                let doc: i64 = r.get(0)?;
                if let Some(t) = toks.get_mut(doc as usize) {
                    t.push(r.get(1)?);
                }
            }
        }
        tx.execute("DELETE FROM p", [])?;
        tx.commit()?;
        let one = |s: &str| -> Option<Option<char>> {
            let mut it = s.chars();
            match (it.next(), it.next()) {
                (None, _) => Some(None),
                (Some(f), None) => Some(Some(f)),
                _ => None,
            }
        };
        Ok(chars
            .iter()
            .enumerate()
            .map(|(i, _)| {
                let (inner, start) = (&toks[2 * i], &toks[2 * i + 1]);
                match inner.as_slice() {
                    [a, b] if a == "q" && b == "q" => Some(CharClass::Separator),
                    [t] if t.len() >= 2 && t.starts_with('q') && t.ends_with('q') => {
                        let f = one(&t[1..t.len() - 1])?;
                        match (start.as_slice(), f) {
                            ([s], Some(f)) if *s == format!("{f}q") => {
                                Some(CharClass::Token(Some(f)))
                            }
                            ([s], f) if s == "q" => Some(CharClass::Continue(f)),
                            _ => None,
                        }
                    }
                    _ => None,
                }
            })
            .collect())
    };
    run().unwrap_or_else(|_| vec![None; chars.len()])
}

/// The classes of the characters above U+00FF in `text`, learning the new ones.
fn classes_of(text: &str) -> Result<HashMap<char, CharClass>, Unsupported> {
    let wide: Vec<char> = text.chars().filter(|c| *c as u32 > 0xff).collect();
    let mut out = HashMap::new();
    if wide.is_empty() {
        return Ok(out);
    }
    let mut learned = LEARNED.lock().unwrap_or_else(|p| p.into_inner());
    let mut new: Vec<char> = wide
        .iter()
        .copied()
        .filter(|c| !learned.contains_key(c))
        .collect();
    new.sort_unstable();
    new.dedup();
    if !new.is_empty() {
        for (c, k) in new.iter().zip(probe(&new)) {
            learned.insert(*c, k);
        }
    }
    for c in wide {
        out.insert(c, learned.get(&c).copied().flatten().ok_or(Unsupported)?);
    }
    Ok(out)
}

/// FTS5's longest term (`FTS5_MAX_TOKEN_SIZE`); longer tokens are cut there.
const MAX_TOKEN_BYTES: usize = 32768;

/// Calls `each` with every token of `text` as the index stores it (folded and stemmed), in
/// order.
pub(crate) fn for_each_token(text: &str, mut each: impl FnMut(&[u8])) -> Result<(), Unsupported> {
    let wide = classes_of(text)?;
    let mut token: Vec<u8> = Vec::with_capacity(64);
    let mut stem: Vec<u8> = Vec::with_capacity(128);
    let mut utf8 = [0u8; 4];
    // Whether a token has started (it may still be empty: a character that folds to nothing).
    let mut open = false;
    for c in text.chars().chain(std::iter::once(' ')) {
        let class = if (c as u32) <= 0xff {
            class_latin1(c)
        } else {
            wide.get(&c).copied().ok_or(Unsupported)?
        };
        let add = match class {
            CharClass::Token(f) => {
                open = true;
                f
            }
            CharClass::Continue(f) if open => f,
            CharClass::Continue(_) => continue,
            CharClass::Separator => {
                if open && !token.is_empty() {
                    if token.len() > MAX_TOKEN_BYTES {
                        return Err(Unsupported);
                    }
                    each(porter(&token, &mut stem));
                }
                token.clear();
                open = false;
                continue;
            }
        };
        if let Some(f) = add {
            token.extend_from_slice(f.encode_utf8(&mut utf8).as_bytes());
        }
    }
    Ok(())
}

/// The tokens of `text` as the index stores them.
pub(crate) fn tokens(text: &str) -> Result<Vec<Vec<u8>>, Unsupported> {
    let mut out = Vec::new();
    for_each_token(text, |t| out.push(t.to_vec()))?;
    Ok(out)
}

fn is_vowel(c: u8, y_is_vowel: bool) -> bool {
    matches!(c, b'a' | b'e' | b'i' | b'o' | b'u') || (y_is_vowel && c == b'y')
}

/// `fts5PorterGobbleVC`: the length of the leading [C]V+C (1-based index after the first
/// consonant following a vowel), or 0.
fn gobble_vc(s: &[u8], prev_cons: bool) -> usize {
    let mut cons = prev_cons;
    let mut i = 0;
    while i < s.len() {
        cons = !is_vowel(s[i], cons);
        if !cons {
            break;
        }
        i += 1;
    }
    i += 1;
    while i < s.len() {
        cons = !is_vowel(s[i], cons);
        if cons {
            return i + 1;
        }
        i += 1;
    }
    0
}

fn m_gt0(s: &[u8]) -> bool {
    gobble_vc(s, false) != 0
}

fn m_gt1(s: &[u8]) -> bool {
    let n = gobble_vc(s, false);
    n != 0 && gobble_vc(&s[n..], true) != 0
}

fn m_eq1(s: &[u8]) -> bool {
    let n = gobble_vc(s, false);
    n != 0 && gobble_vc(&s[n..], true) == 0
}

/// `*o`: the stem ends consonant-vowel-consonant, the last not w, x or y.
fn o_star(s: &[u8]) -> bool {
    match s.last() {
        None | Some(b'w' | b'x' | b'y') => false,
        Some(_) => {
            let mut mask = 0u32;
            let mut cons = false;
            for &c in s {
                cons = !is_vowel(c, cons);
                mask = (mask << 1) + u32::from(cons);
            }
            mask & 7 == 5
        }
    }
}

fn m_gt1_s_or_t(s: &[u8]) -> bool {
    matches!(s.last(), Some(b's' | b't')) && m_gt1(s)
}

/// `*v*`: the stem has a vowel (y counts after the first letter).
fn has_vowel(s: &[u8]) -> bool {
    s.iter().enumerate().any(|(i, &c)| is_vowel(c, i > 0))
}

type Cond = fn(&[u8]) -> bool;
/// A rule: suffix, condition on the stem, replacement.
type Rule = (&'static str, Cond, &'static str);
/// A step: rule groups keyed by the word's second-to-last byte.
type Step = &'static [(u8, &'static [Rule])];

/// One generated step: rules grouped by the word's second-to-last byte; within a group the
/// first rule whose suffix matches (the word being longer than the suffix) is the only one
/// tried. Returns whether a rule fired.
fn step(w: &mut Vec<u8>, groups: Step) -> bool {
    let n = w.len();
    if n < 2 {
        return false;
    }
    let key = w[n - 2];
    let Some((_, rules)) = groups.iter().find(|(k, _)| *k == key) else {
        return false;
    };
    for &(suffix, cond, out) in *rules {
        let s = suffix.as_bytes();
        if n > s.len() && w.ends_with(s) {
            let stem = n - s.len();
            if cond(&w[..stem]) {
                w.truncate(stem);
                w.extend_from_slice(out.as_bytes());
                return true;
            }
            return false;
        }
    }
    false
}

fn always(_: &[u8]) -> bool {
    true
}

const STEP1B: Step = &[
    (b'e', &[("eed", m_gt0, "ee"), ("ed", has_vowel, "")]),
    (b'n', &[("ing", has_vowel, "")]),
];
const STEP1B2: Step = &[
    (b'a', &[("at", always, "ate")]),
    (b'b', &[("bl", always, "ble")]),
    (b'i', &[("iz", always, "ize")]),
];
const STEP2: Step = &[
    (
        b'a',
        &[("ational", m_gt0, "ate"), ("tional", m_gt0, "tion")],
    ),
    (b'c', &[("enci", m_gt0, "ence"), ("anci", m_gt0, "ance")]),
    (b'e', &[("izer", m_gt0, "ize")]),
    (b'g', &[("logi", m_gt0, "log")]),
    (
        b'l',
        &[
            ("bli", m_gt0, "ble"),
            ("alli", m_gt0, "al"),
            ("entli", m_gt0, "ent"),
            ("eli", m_gt0, "e"),
            ("ousli", m_gt0, "ous"),
        ],
    ),
    (
        b'o',
        &[
            ("ization", m_gt0, "ize"),
            ("ation", m_gt0, "ate"),
            ("ator", m_gt0, "ate"),
        ],
    ),
    (
        b's',
        &[
            ("alism", m_gt0, "al"),
            ("iveness", m_gt0, "ive"),
            ("fulness", m_gt0, "ful"),
            ("ousness", m_gt0, "ous"),
        ],
    ),
    (
        b't',
        &[
            ("aliti", m_gt0, "al"),
            ("iviti", m_gt0, "ive"),
            ("biliti", m_gt0, "ble"),
        ],
    ),
];
const STEP3: Step = &[
    (b'a', &[("ical", m_gt0, "ic")]),
    (b's', &[("ness", m_gt0, "")]),
    (b't', &[("icate", m_gt0, "ic"), ("iciti", m_gt0, "ic")]),
    (b'u', &[("ful", m_gt0, "")]),
    (b'v', &[("ative", m_gt0, "")]),
    (b'z', &[("alize", m_gt0, "al")]),
];
const STEP4: Step = &[
    (b'a', &[("al", m_gt1, "")]),
    (b'c', &[("ance", m_gt1, ""), ("ence", m_gt1, "")]),
    (b'e', &[("er", m_gt1, "")]),
    (b'i', &[("ic", m_gt1, "")]),
    (b'l', &[("able", m_gt1, ""), ("ible", m_gt1, "")]),
    (
        b'n',
        &[
            ("ant", m_gt1, ""),
            ("ement", m_gt1, ""),
            ("ment", m_gt1, ""),
            ("ent", m_gt1, ""),
        ],
    ),
    (b'o', &[("ion", m_gt1_s_or_t, ""), ("ou", m_gt1, "")]),
    (b's', &[("ism", m_gt1, "")]),
    (b't', &[("ate", m_gt1, ""), ("iti", m_gt1, "")]),
    (b'u', &[("ous", m_gt1, "")]),
    (b'v', &[("ive", m_gt1, "")]),
    (b'z', &[("ize", m_gt1, "")]),
];

/// The porter stem of `token` (`fts5PorterCb`), in `buf`.
fn porter<'a>(token: &'a [u8], buf: &'a mut Vec<u8>) -> &'a [u8] {
    if token.len() < 3 || token.len() > 64 {
        return token;
    }
    let w = buf;
    w.clear();
    w.extend_from_slice(token);
    // Step 1a.
    let n = w.len();
    if w[n - 1] == b's' {
        if w[n - 2] == b'e' {
            if (n > 4 && w[n - 4] == b's' && w[n - 3] == b's') || (n > 3 && w[n - 3] == b'i') {
                w.truncate(n - 2);
            } else {
                w.truncate(n - 1);
            }
        } else if w[n - 2] != b's' {
            w.truncate(n - 1);
        }
    }
    // Step 1b: only "ed"/"ing" removal reports a change ("eed" -> "ee" does not).
    let n = w.len();
    let ed_ing = (n > 2 && w.ends_with(b"ed") && !(n > 3 && w.ends_with(b"eed")))
        || (n > 3 && w.ends_with(b"ing"));
    if step(w, STEP1B) && ed_ing && !step(w, STEP1B2) {
        let n = w.len();
        let c = w[n - 1];
        if !is_vowel(c, false) && c != b'l' && c != b's' && c != b'z' && n >= 2 && c == w[n - 2] {
            w.truncate(n - 1);
        } else if m_eq1(w) && o_star(w) {
            w.push(b'e');
        }
    }
    // Step 1c.
    let n = w.len();
    if w[n - 1] == b'y' && has_vowel(&w[..n - 1]) {
        w[n - 1] = b'i';
    }
    step(w, STEP2);
    step(w, STEP3);
    step(w, STEP4);
    // Step 5a.
    let n = w.len();
    if w[n - 1] == b'e' {
        let s = &w[..n - 1];
        if m_gt1(s) || (m_eq1(s) && !o_star(s)) {
            w.truncate(n - 1);
        }
    }
    // Step 5b.
    let n = w.len();
    if n > 1 && w[n - 1] == b'l' && w[n - 2] == b'l' && m_gt1(&w[..n - 1]) {
        w.truncate(n - 1);
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stem(w: &str) -> String {
        let mut buf = Vec::new();
        String::from_utf8(porter(w.as_bytes(), &mut buf).to_vec()).unwrap()
    }

    #[test]
    fn porter_stems_like_the_reference_algorithm() {
        for (w, s) in [
            ("caresses", "caress"),
            ("ponies", "poni"),
            ("ties", "ti"),
            ("cats", "cat"),
            ("feed", "feed"),
            ("agreed", "agre"),
            ("plastered", "plaster"),
            ("motoring", "motor"),
            ("sing", "sing"),
            ("conflated", "conflat"),
            ("troubled", "troubl"),
            ("sized", "size"),
            ("hopping", "hop"),
            ("falling", "fall"),
            ("filing", "file"),
            ("happy", "happi"),
            ("relational", "relat"),
            ("conditional", "condit"),
            ("vietnamization", "vietnam"),
            ("hopefulness", "hope"),
            ("electrical", "electr"),
            ("revival", "reviv"),
            ("adjustment", "adjust"),
            ("adoption", "adopt"),
            ("controll", "control"),
            ("roll", "roll"),
            ("generalizations", "gener"),
            ("philosophy", "philosophi"),
            ("invented", "invent"),
            ("telephone", "telephon"),
            ("as", "as"),
            ("aed", "a"),
        ] {
            assert_eq!(stem(w), s, "stem of {w}");
        }
    }

    #[test]
    fn tokens_fold_case_and_diacritics_and_split_on_punctuation() {
        let t = tokens("Café-au-lait, NAÏVE résumés! x×y 2½ µ").unwrap();
        let t: Vec<String> = t
            .into_iter()
            .map(|t| String::from_utf8(t).unwrap())
            .collect();
        assert_eq!(
            t,
            ["cafe", "au", "lait", "naiv", "resum", "x", "y", "2½", "μ"]
        );
        // Beyond Latin-1, as SQLite's unicode61 says: Greek folds, a combining accent joins
        // the token and is dropped, CJK ideographs are letters, dashes and quotes separate.
        let t: Vec<String> = tokens("ΩMEGA Ωmega cafe\u{301} 東京 a\u{2014}b \u{201c}x\u{201d}")
            .unwrap()
            .into_iter()
            .map(|t| String::from_utf8(t).unwrap())
            .collect();
        assert_eq!(t, ["ωmega", "ωmega", "cafe", "東京", "a", "b", "x"]);
    }

    /// The tokens SQLite's FTS5 `porter unicode61` stores for each text, in order (through an
    /// `fts5vocab` instance table over an in-memory index).
    fn fts5_tokens(texts: &[String]) -> Vec<Vec<String>> {
        let db = rusqlite::Connection::open_in_memory().unwrap();
        db.execute_batch(
            "CREATE VIRTUAL TABLE t USING fts5(body, tokenize = 'porter unicode61');
             CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance');",
        )
        .unwrap();
        for (i, t) in texts.iter().enumerate() {
            db.execute(
                "INSERT INTO t(rowid, body) VALUES (?1, ?2)",
                rusqlite::params![i as i64, t],
            )
            .unwrap();
        }
        let mut out = vec![Vec::new(); texts.len()];
        let mut st = db
            .prepare("SELECT doc, term FROM v ORDER BY doc, offset")
            .unwrap();
        let rows = st
            .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
            .unwrap();
        for r in rows {
            let (doc, term) = r.unwrap();
            out[doc as usize].push(term);
        }
        out
    }

    fn rust_tokens(text: &str) -> Vec<String> {
        tokens(text)
            .unwrap()
            .into_iter()
            .map(|t| String::from_utf8(t).unwrap())
            .collect()
    }

    #[test]
    fn every_latin1_character_tokenizes_as_in_fts5() {
        // Each character alone, between letters, doubled and after a stemmable word.
        let texts: Vec<String> = (1u32..=0xff)
            .filter_map(char::from_u32)
            .map(|c| format!("{c} ab{c}cd {c}{c} runs{c} {c}ing"))
            .collect();
        let want = fts5_tokens(&texts);
        for (t, w) in texts.iter().zip(&want) {
            assert_eq!(&rust_tokens(t), w, "text {t:?}");
        }
    }

    #[test]
    fn characters_beyond_latin1_tokenize_as_in_fts5() {
        // Latin Extended, IPA, combining diacritics, Greek, Cyrillic, general punctuation,
        // letter-like symbols, CJK, private use, an emoji.
        let ranges = [
            0x100u32..0x250,
            0x250..0x2b0,
            0x2b0..0x380,
            0x380..0x530,
            0x1e00..0x1f00,
            0x2000..0x2200,
            0x3000..0x3040,
            0x4e00..0x4e40,
            0xe000..0xe010,
            0xff00..0xff60,
            0x1f600..0x1f610,
        ];
        let texts: Vec<String> = ranges
            .into_iter()
            .flatten()
            .filter_map(char::from_u32)
            .map(|c| format!("{c} ab{c}cd {c}{c} runs{c} {c}ing É{c}"))
            .collect();
        let want = fts5_tokens(&texts);
        for (t, w) in texts.iter().zip(&want) {
            assert_eq!(&rust_tokens(t), w, "text {t:?}");
        }
    }

    #[test]
    fn porter_stems_as_in_fts5() {
        // Every suffix the rules know after stems of different measure, plus plain words.
        let stems = [
            "",
            "a",
            "b",
            "y",
            "ab",
            "tr",
            "oy",
            "ya",
            "by",
            "hop",
            "fil",
            "rel",
            "cond",
            "gener",
            "troub",
            "agr",
            "happ",
            "sy",
            "fizz",
            "tann",
            "controll",
            "generaliz",
            "electr",
            "eed",
            "xyz",
            "bowl",
            "wax",
            "sk",
        ];
        let suffixes = [
            "", "s", "es", "ies", "sses", "ss", "ed", "eed", "ing", "y", "ly", "at", "bl", "iz",
            "ational", "tional", "enci", "anci", "izer", "logi", "bli", "alli", "entli", "eli",
            "ousli", "ization", "ation", "ator", "alism", "iveness", "fulness", "ousness", "aliti",
            "iviti", "biliti", "icate", "ative", "alize", "iciti", "ical", "ful", "ness", "al",
            "ance", "ence", "er", "ic", "able", "ible", "ant", "ement", "ment", "ent", "ion",
            "sion", "tion", "ou", "ism", "ate", "iti", "ous", "ive", "ize", "e", "ll", "ated",
            "ating", "izing", "bled", "ies", "ied", "ying", "ee", "ered", "ers",
        ];
        let mut texts = Vec::new();
        for s in stems {
            let words: Vec<String> = suffixes.iter().map(|x| format!("{s}{x}")).collect();
            texts.push(words.join(" "));
        }
        texts.push(
            "Political philosophy rejecting the state; who invented the telephone? Chemical \
             element with atomic number 79, ancient Greek philosopher. Vaccines train the \
             immune system. Theory of evolution by natural selection; a city famous for its \
             canals; monarchy abolished after a revolution. Generalizations, relational \
             hopefulness, conditionally, sensibilities, caresses, ponies, agreed, feed."
                .to_string(),
        );
        let long = "x".repeat(64) + "ing " + &"y".repeat(61) + "ing";
        texts.push(long);
        let want = fts5_tokens(&texts);
        for (t, w) in texts.iter().zip(&want) {
            assert_eq!(&rust_tokens(t), w, "text {t:?}");
        }
    }
}
