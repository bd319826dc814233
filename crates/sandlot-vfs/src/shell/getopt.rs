//! `getopt_long` with GNU argument permutation and GNU's diagnostics.

/// Whether a long option takes an argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arg {
    No,
    Required,
    Optional,
}

/// Option table of one command.
pub(crate) struct Spec {
    /// Short options, `getopt` style (`"n:v"`).
    pub short: &'static str,
    /// Long options: name, argument kind, key reported (a short letter or the name).
    pub long: &'static [(&'static str, Arg, &'static str)],
    /// Accept `-NUM` (e.g. `head -5`, `grep -2`), reported with key `"#"`.
    pub digits: bool,
}

/// A parsed option: key (short letter or long key) and its argument.
pub(crate) type Opt = (String, Option<String>);

/// Parse `args`; on error returns the diagnostic lines (without trailing newline).
pub(crate) fn parse(
    prog: &str,
    spec: &Spec,
    args: &[String],
) -> Result<(Vec<Opt>, Vec<String>), String> {
    let mut opts = Vec::new();
    let mut operands = Vec::new();
    let short_arg = |c: char| -> Option<bool> {
        let i = spec.short.find(c)?;
        Some(spec.short[i + c.len_utf8()..].starts_with(':'))
    };
    let try_help = format!("Try '{prog} --help' for more information.");
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        i += 1;
        if a == "--" {
            operands.extend(args[i..].iter().cloned());
            break;
        }
        if let Some(body) = a.strip_prefix("--") {
            let (name, val) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (body, None),
            };
            let exact = spec.long.iter().find(|l| l.0 == name);
            let cands: Vec<_> = spec.long.iter().filter(|l| l.0.starts_with(name)).collect();
            let found = match exact {
                Some(l) => l,
                None => {
                    // Abbreviations that all name the same key are not ambiguous.
                    let distinct: std::collections::BTreeSet<&str> =
                        cands.iter().map(|l| l.2).collect();
                    match cands.len() {
                        0 => return Err(format!("{prog}: unrecognized option '{a}'\n{try_help}")),
                        _ if distinct.len() == 1 => cands[0],
                        _ => {
                            let poss: Vec<String> =
                                cands.iter().map(|l| format!("'--{}'", l.0)).collect();
                            return Err(format!(
                                "{prog}: option '--{name}' is ambiguous; possibilities: {}\n{try_help}",
                                poss.join(" ")
                            ));
                        }
                    }
                }
            };
            match found.1 {
                Arg::No => {
                    if val.is_some() {
                        return Err(format!(
                            "{prog}: option '--{}' doesn't allow an argument\n{try_help}",
                            found.0
                        ));
                    }
                    opts.push((found.2.to_string(), None));
                }
                Arg::Optional => opts.push((found.2.to_string(), val)),
                Arg::Required => {
                    let v = match val {
                        Some(v) => v,
                        None if i < args.len() => {
                            i += 1;
                            args[i - 1].clone()
                        }
                        None => {
                            return Err(format!(
                                "{prog}: option '--{}' requires an argument\n{try_help}",
                                found.0
                            ))
                        }
                    };
                    opts.push((found.2.to_string(), Some(v)));
                }
            }
            continue;
        }
        if a.len() > 1 && a.starts_with('-') {
            let chars: Vec<char> = a[1..].chars().collect();
            let mut j = 0;
            while j < chars.len() {
                let c = chars[j];
                if spec.digits && c.is_ascii_digit() {
                    let start = j;
                    while j < chars.len() && chars[j].is_ascii_digit() {
                        j += 1;
                    }
                    opts.push(("#".to_string(), Some(chars[start..j].iter().collect())));
                    continue;
                }
                match short_arg(c) {
                    None => return Err(format!("{prog}: invalid option -- '{c}'\n{try_help}")),
                    Some(false) => {
                        opts.push((c.to_string(), None));
                        j += 1;
                    }
                    Some(true) => {
                        let rest: String = chars[j + 1..].iter().collect();
                        let v = if !rest.is_empty() {
                            rest
                        } else if i < args.len() {
                            i += 1;
                            args[i - 1].clone()
                        } else {
                            return Err(format!(
                                "{prog}: option requires an argument -- '{c}'\n{try_help}"
                            ));
                        };
                        opts.push((c.to_string(), Some(v)));
                        break;
                    }
                }
            }
            continue;
        }
        operands.push(a.clone());
    }
    Ok((opts, operands))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: Spec = Spec {
        short: "n:vq",
        long: &[
            ("lines", Arg::Required, "n"),
            ("verbose", Arg::No, "v"),
            ("quiet", Arg::No, "q"),
            ("silent", Arg::No, "q"),
        ],
        digits: true,
    };

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn permutes_and_clusters() {
        let (o, ops) = parse(
            "head",
            &SPEC,
            &s(&["a", "-vn3", "b", "--lines=4", "-5", "--", "-q"]),
        )
        .unwrap();
        assert_eq!(
            o,
            vec![
                ("v".into(), None),
                ("n".into(), Some("3".into())),
                ("n".into(), Some("4".into())),
                ("#".into(), Some("5".into()))
            ]
        );
        assert_eq!(ops, s(&["a", "b", "-q"]));
    }

    #[test]
    fn gnu_errors() {
        assert_eq!(
            parse("head", &SPEC, &s(&["-z"])).unwrap_err(),
            "head: invalid option -- 'z'\nTry 'head --help' for more information."
        );
        assert_eq!(
            parse("head", &SPEC, &s(&["-n"])).unwrap_err(),
            "head: option requires an argument -- 'n'\nTry 'head --help' for more information."
        );
        assert_eq!(
            parse("head", &SPEC, &s(&["--bogus"])).unwrap_err(),
            "head: unrecognized option '--bogus'\nTry 'head --help' for more information."
        );
        assert!(parse("head", &SPEC, &s(&["--verbose=1"]))
            .unwrap_err()
            .contains("doesn't allow an argument"));
        assert_eq!(
            parse("head", &SPEC, &s(&["--verb"])).unwrap().0,
            vec![("v".to_string(), None)]
        );
    }
}
