//! A bash-subset parser: words with quoting and `$VAR`, pipelines, `&&`/`||`/`;`,
//! redirections, `( )`/`{ }` groups, `for`, `while`/`until` and `if`.

use std::fmt;

/// A piece of a word before expansion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    /// Literal text; `quoted` text is neither split nor globbed.
    Lit { text: String, quoted: bool },
    /// `$NAME`, `${NAME}` or `$?`.
    Var { name: String, quoted: bool },
}

/// A word: segments concatenated.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Word {
    pub segs: Vec<Seg>,
}

impl Word {
    /// The literal text if the word is a single unquoted literal (for keywords).
    pub fn as_keyword(&self) -> Option<&str> {
        match self.segs.as_slice() {
            [Seg::Lit {
                text,
                quoted: false,
            }] => Some(text),
            _ => None,
        }
    }

    fn push_lit(&mut self, c: char, quoted: bool) {
        if let Some(Seg::Lit { text, quoted: q }) = self.segs.last_mut() {
            if *q == quoted {
                text.push(c);
                return;
            }
        }
        self.segs.push(Seg::Lit {
            text: c.to_string(),
            quoted,
        });
    }

    /// Ensure an empty quoted string still produces an argument (`""`).
    fn push_empty_quoted(&mut self) {
        self.segs.push(Seg::Lit {
            text: String::new(),
            quoted: true,
        });
    }
}

/// Redirection operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedirOp {
    /// `[n]<`
    In,
    /// `[n]>` (and `>|`)
    Out,
    /// `[n]>>`
    Append,
    /// `[n]>&m` / `[n]<&m`
    Dup,
    /// `&>` / `>&file` (stdout and stderr)
    OutErr,
    /// `&>>`
    AppendErr,
    /// `<<<` here-string
    HereString,
}

/// One redirection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redir {
    pub fd: u32,
    pub op: RedirOp,
    pub target: Word,
}

/// `NAME=value` before a command (or alone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assign {
    pub name: String,
    pub value: Word,
}

/// A command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Simple {
        assigns: Vec<Assign>,
        words: Vec<Word>,
        redirs: Vec<Redir>,
        line: usize,
    },
    Group {
        body: List,
        subshell: bool,
        redirs: Vec<Redir>,
    },
    For {
        var: String,
        items: Option<Vec<Word>>,
        body: List,
        redirs: Vec<Redir>,
    },
    While {
        cond: List,
        body: List,
        until: bool,
        redirs: Vec<Redir>,
    },
    If {
        branches: Vec<(List, List)>,
        else_body: Option<List>,
        redirs: Vec<Redir>,
    },
}

/// `! a | b | c`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pipeline {
    pub negate: bool,
    pub cmds: Vec<Command>,
}

/// Connector between pipelines of an and-or list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conn {
    And,
    Or,
}

/// `p1 && p2 || p3`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AndOr {
    pub first: Pipeline,
    pub rest: Vec<(Conn, Pipeline)>,
}

/// A sequence of and-or lists.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct List {
    pub items: Vec<AndOr>,
}

/// A parse failure, rendered like bash's messages for `bash -c`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError {
    pub line: usize,
    pub message: String,
    /// Source line echoed by bash after "syntax error near unexpected token".
    pub source_line: Option<String>,
}

impl SyntaxError {
    /// bash reports grammar errors with `-c:` and status 2; expansion errors
    /// such as a bad substitution without it and status 1.
    fn is_grammar(&self) -> bool {
        self.message.starts_with("syntax error") || self.message.starts_with("unexpected EOF")
    }

    /// Exit status bash gives this error.
    pub fn status(&self) -> i32 {
        if self.message.ends_with("bad substitution") {
            1
        } else {
            2
        }
    }
}

impl fmt::Display for SyntaxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_grammar() {
            writeln!(f, "bash: -c: line {}: {}", self.line, self.message)?;
        } else {
            writeln!(f, "bash: line {}: {}", self.line, self.message)?;
        }
        if let Some(src) = &self.source_line {
            writeln!(f, "bash: -c: line {}: `{}'", self.line, src)?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Word(Word),
    /// Operator: `|`, `||`, `&&`, `;`, `;;`, `&`, `(`, `)`, newline as "\n".
    Op(&'static str),
    Redir {
        fd: Option<u32>,
        op: RedirOp,
    },
    /// `<<` heredoc: unsupported, reported at parse time.
    Heredoc,
}

struct Lexer<'a> {
    chars: Vec<char>,
    pos: usize,
    line: usize,
    _src: std::marker::PhantomData<&'a str>,
}

/// Token with its line number.
type Spanned = (Tok, usize);

fn is_meta(c: char) -> bool {
    matches!(
        c,
        '|' | '&' | ';' | '(' | ')' | '<' | '>' | ' ' | '\t' | '\n'
    )
}

fn is_name_start(c: char) -> bool {
    c == '_' || c.is_ascii_alphabetic()
}

fn is_name_char(c: char) -> bool {
    c == '_' || c.is_ascii_alphanumeric()
}

impl<'a> Lexer<'a> {
    fn new(src: &'a str) -> Self {
        Lexer {
            chars: src.chars().collect(),
            pos: 0,
            line: 1,
            _src: std::marker::PhantomData,
        }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn peek_at(&self, n: usize) -> Option<char> {
        self.chars.get(self.pos + n).copied()
    }

    fn err(&self, message: String) -> SyntaxError {
        SyntaxError {
            line: self.line,
            message,
            source_line: None,
        }
    }

    fn tokens(mut self) -> Result<Vec<Spanned>, SyntaxError> {
        let mut out = Vec::new();
        loop {
            // Skip blanks and line continuations.
            while let Some(c) = self.peek() {
                if c == ' ' || c == '\t' {
                    self.pos += 1;
                } else if c == '\\' && self.peek_at(1) == Some('\n') {
                    self.pos += 2;
                    self.line += 1;
                } else {
                    break;
                }
            }
            let Some(c) = self.peek() else { break };
            let line = self.line;
            if c == '#' {
                while let Some(c) = self.peek() {
                    if c == '\n' {
                        break;
                    }
                    self.pos += 1;
                }
                continue;
            }
            if c == '\n' {
                self.pos += 1;
                self.line += 1;
                out.push((Tok::Op("\n"), line));
                continue;
            }
            // IO number: digits immediately followed by < or >.
            if c.is_ascii_digit() {
                let mut j = self.pos;
                while j < self.chars.len() && self.chars[j].is_ascii_digit() {
                    j += 1;
                }
                if j < self.chars.len() && (self.chars[j] == '<' || self.chars[j] == '>') {
                    let fd: u32 = self.chars[self.pos..j]
                        .iter()
                        .collect::<String>()
                        .parse()
                        .unwrap_or(u32::MAX);
                    self.pos = j;
                    let tok = self.redir_op(Some(fd));
                    out.push((tok, line));
                    continue;
                }
            }
            if let Some(t) = self.operator() {
                out.push((t, line));
                continue;
            }
            let w = self.word()?;
            out.push((Tok::Word(w), line));
        }
        Ok(out)
    }

    fn redir_op(&mut self, fd: Option<u32>) -> Tok {
        let c = self.peek().unwrap_or(' ');
        self.pos += 1;
        let n = self.peek();
        let op = if c == '<' {
            match n {
                Some('<') => {
                    self.pos += 1;
                    if self.peek() == Some('<') {
                        self.pos += 1;
                        RedirOp::HereString
                    } else {
                        return Tok::Heredoc;
                    }
                }
                Some('&') => {
                    self.pos += 1;
                    RedirOp::Dup
                }
                Some('>') => {
                    // `<>` read-write open: treat as output (fails read-only).
                    self.pos += 1;
                    RedirOp::Out
                }
                _ => RedirOp::In,
            }
        } else {
            match n {
                Some('>') => {
                    self.pos += 1;
                    RedirOp::Append
                }
                Some('&') => {
                    self.pos += 1;
                    RedirOp::Dup
                }
                Some('|') => {
                    self.pos += 1;
                    RedirOp::Out
                }
                _ => RedirOp::Out,
            }
        };
        Tok::Redir { fd, op }
    }

    fn operator(&mut self) -> Option<Tok> {
        let c = self.peek()?;
        let n = self.peek_at(1);
        let (tok, len) = match (c, n) {
            ('&', Some('&')) => (Tok::Op("&&"), 2),
            ('&', Some('>')) => {
                if self.peek_at(2) == Some('>') {
                    (
                        Tok::Redir {
                            fd: None,
                            op: RedirOp::AppendErr,
                        },
                        3,
                    )
                } else {
                    (
                        Tok::Redir {
                            fd: None,
                            op: RedirOp::OutErr,
                        },
                        2,
                    )
                }
            }
            ('&', _) => (Tok::Op("&"), 1),
            ('|', Some('|')) => (Tok::Op("||"), 2),
            ('|', Some('&')) => (Tok::Op("|&"), 2),
            ('|', _) => (Tok::Op("|"), 1),
            (';', Some(';')) => (Tok::Op(";;"), 2),
            (';', _) => (Tok::Op(";"), 1),
            ('(', _) => (Tok::Op("("), 1),
            (')', _) => (Tok::Op(")"), 1),
            ('<', _) | ('>', _) => return Some(self.redir_op(None)),
            _ => return None,
        };
        self.pos += len;
        Some(tok)
    }

    fn var(&mut self, w: &mut Word, quoted: bool) -> Result<(), SyntaxError> {
        // self.peek() == '$'
        let n = self.peek_at(1);
        match n {
            Some('{') => {
                let start = self.pos + 2;
                let mut j = start;
                while j < self.chars.len() && self.chars[j] != '}' {
                    j += 1;
                }
                if j >= self.chars.len() {
                    return Err(self.err("unexpected EOF while looking for matching `}'".into()));
                }
                let name: String = self.chars[start..j].iter().collect();
                let valid = name == "?"
                    || name == "#"
                    || (name.chars().next().is_some_and(is_name_start)
                        && name.chars().all(is_name_char))
                    || (!name.is_empty() && name.chars().all(|c| c.is_ascii_digit()));
                if !valid {
                    return Err(SyntaxError {
                        line: self.line,
                        message: format!("${{{name}}}: bad substitution"),
                        source_line: None,
                    });
                }
                w.segs.push(Seg::Var { name, quoted });
                self.pos = j + 1;
            }
            Some('(') => {
                return Err(self.err(
                    "command substitution `$(...)` is not supported by the virtual shell".into(),
                ))
            }
            Some(c) if c == '?' || c == '#' || c == '$' || c.is_ascii_digit() => {
                w.segs.push(Seg::Var {
                    name: c.to_string(),
                    quoted,
                });
                self.pos += 2;
            }
            Some(c) if is_name_start(c) => {
                let start = self.pos + 1;
                let mut j = start;
                while j < self.chars.len() && is_name_char(self.chars[j]) {
                    j += 1;
                }
                w.segs.push(Seg::Var {
                    name: self.chars[start..j].iter().collect(),
                    quoted,
                });
                self.pos = j;
            }
            _ => {
                w.push_lit('$', quoted);
                self.pos += 1;
            }
        }
        Ok(())
    }

    fn word(&mut self) -> Result<Word, SyntaxError> {
        let mut w = Word::default();
        while let Some(c) = self.peek() {
            if is_meta(c) {
                break;
            }
            match c {
                '\\' => {
                    match self.peek_at(1) {
                        Some('\n') => {
                            self.line += 1;
                        }
                        Some(n) => w.push_lit(n, true),
                        None => w.push_lit('\\', false),
                    }
                    self.pos += 2;
                }
                '\'' => {
                    let start = self.pos + 1;
                    let mut j = start;
                    while j < self.chars.len() && self.chars[j] != '\'' {
                        j += 1;
                    }
                    if j >= self.chars.len() {
                        return Err(
                            self.err("unexpected EOF while looking for matching `''".into())
                        );
                    }
                    let text: String = self.chars[start..j].iter().collect();
                    self.line += text.matches('\n').count();
                    if text.is_empty() {
                        w.push_empty_quoted();
                    }
                    for ch in text.chars() {
                        w.push_lit(ch, true);
                    }
                    self.pos = j + 1;
                }
                '"' => {
                    self.pos += 1;
                    let mut any = false;
                    loop {
                        let Some(c) = self.peek() else {
                            return Err(
                                self.err("unexpected EOF while looking for matching `\"'".into())
                            );
                        };
                        match c {
                            '"' => {
                                self.pos += 1;
                                break;
                            }
                            '\\' => {
                                match self.peek_at(1) {
                                    Some(n @ ('$' | '`' | '"' | '\\')) => w.push_lit(n, true),
                                    Some('\n') => self.line += 1,
                                    Some(n) => {
                                        w.push_lit('\\', true);
                                        w.push_lit(n, true);
                                    }
                                    None => w.push_lit('\\', true),
                                }
                                self.pos += 2;
                                any = true;
                            }
                            '$' => {
                                self.var(&mut w, true)?;
                                any = true;
                            }
                            '`' => {
                                return Err(self.err("command substitution (backquotes) is not supported by the virtual shell".into()))
                            }
                            _ => {
                                if c == '\n' {
                                    self.line += 1;
                                }
                                w.push_lit(c, true);
                                self.pos += 1;
                                any = true;
                            }
                        }
                    }
                    if !any {
                        w.push_empty_quoted();
                    }
                }
                '$' => self.var(&mut w, false)?,
                '`' => {
                    return Err(self.err(
                        "command substitution (backquotes) is not supported by the virtual shell"
                            .into(),
                    ))
                }
                _ => {
                    w.push_lit(c, false);
                    self.pos += 1;
                }
            }
        }
        Ok(w)
    }
}

struct Parser {
    toks: Vec<Spanned>,
    pos: usize,
    src_lines: Vec<String>,
    last_line: usize,
    eof_line: usize,
}

const RESERVED: [&str; 13] = [
    "then", "else", "elif", "fi", "do", "done", "esac", "}", "{", "!", "in", "case", "function",
];

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|t| &t.0)
    }

    fn line(&self) -> usize {
        self.toks
            .get(self.pos)
            .map(|t| t.1)
            .unwrap_or(self.last_line)
    }

    fn unexpected(&self) -> SyntaxError {
        let line = self.line();
        let src = self.src_lines.get(line - 1).cloned().unwrap_or_default();
        match self.peek() {
            None => SyntaxError {
                line: self.eof_line,
                message: "syntax error: unexpected end of file".into(),
                source_line: None,
            },
            Some(t) => {
                let text = match t {
                    Tok::Op("\n") => "newline".to_string(),
                    Tok::Op(o) => o.to_string(),
                    Tok::Word(w) => w.as_keyword().unwrap_or("word").to_string(),
                    Tok::Redir { op, .. } => match op {
                        RedirOp::In => "<",
                        RedirOp::Out => ">",
                        RedirOp::Append => ">>",
                        RedirOp::Dup => ">&",
                        RedirOp::OutErr => "&>",
                        RedirOp::AppendErr => "&>>",
                        RedirOp::HereString => "<<<",
                    }
                    .to_string(),
                    Tok::Heredoc => "<<".to_string(),
                };
                SyntaxError {
                    line,
                    message: format!("syntax error near unexpected token `{text}'"),
                    source_line: Some(src),
                }
            }
        }
    }

    fn is_kw(&self, kw: &str) -> bool {
        matches!(self.peek(), Some(Tok::Word(w)) if w.as_keyword() == Some(kw))
    }

    fn skip_newlines(&mut self) {
        while matches!(self.peek(), Some(Tok::Op("\n"))) {
            self.pos += 1;
        }
    }

    fn expect_kw(&mut self, kw: &str) -> Result<(), SyntaxError> {
        if self.is_kw(kw) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.unexpected())
        }
    }

    /// list terminated by EOF or one of `stops` keywords / `)`.
    fn list(&mut self, stops: &[&str]) -> Result<List, SyntaxError> {
        let mut items = Vec::new();
        loop {
            self.skip_newlines();
            match self.peek() {
                None => break,
                Some(Tok::Op(")")) if stops.contains(&")") => break,
                Some(Tok::Word(w)) if w.as_keyword().is_some_and(|k| stops.contains(&k)) => break,
                _ => {}
            }
            items.push(self.and_or()?);
            match self.peek() {
                Some(Tok::Op(";")) | Some(Tok::Op("\n")) => self.pos += 1,
                Some(Tok::Op("&")) => {
                    return Err(SyntaxError {
                        line: self.line(),
                        message: "background jobs (`&`) are not supported by the virtual shell"
                            .into(),
                        source_line: None,
                    })
                }
                None => break,
                Some(Tok::Op(")")) if stops.contains(&")") => break,
                Some(Tok::Word(w)) if w.as_keyword().is_some_and(|k| stops.contains(&k)) => break,
                _ => return Err(self.unexpected()),
            }
        }
        Ok(List { items })
    }

    fn and_or(&mut self) -> Result<AndOr, SyntaxError> {
        let first = self.pipeline()?;
        let mut rest = Vec::new();
        loop {
            let conn = match self.peek() {
                Some(Tok::Op("&&")) => Conn::And,
                Some(Tok::Op("||")) => Conn::Or,
                _ => break,
            };
            self.pos += 1;
            self.skip_newlines();
            rest.push((conn, self.pipeline()?));
        }
        Ok(AndOr { first, rest })
    }

    fn pipeline(&mut self) -> Result<Pipeline, SyntaxError> {
        let mut negate = false;
        while self.is_kw("!") {
            negate = !negate;
            self.pos += 1;
        }
        let mut cmds = vec![self.command()?];
        loop {
            match self.peek() {
                Some(Tok::Op("|")) => {}
                Some(Tok::Op("|&")) => {
                    // `a |& b` is `a 2>&1 | b`.
                    if let Some(last) = cmds.last_mut() {
                        redirs_of(last).push(Redir {
                            fd: 2,
                            op: RedirOp::Dup,
                            target: Word {
                                segs: vec![Seg::Lit {
                                    text: "1".into(),
                                    quoted: false,
                                }],
                            },
                        });
                    }
                }
                _ => break,
            }
            self.pos += 1;
            self.skip_newlines();
            cmds.push(self.command()?);
        }
        Ok(Pipeline { negate, cmds })
    }

    fn redirect(&mut self, fd: Option<u32>, op: RedirOp) -> Result<Redir, SyntaxError> {
        self.pos += 1;
        match self.peek() {
            Some(Tok::Word(w)) => {
                let w = w.clone();
                self.pos += 1;
                let fd = fd.unwrap_or(match op {
                    RedirOp::In | RedirOp::HereString => 0,
                    _ => 1,
                });
                // `>&word` where word is not a number means `&>word`.
                let op = if op == RedirOp::Dup
                    && fd == 1
                    && !w
                        .as_keyword()
                        .is_some_and(|k| k == "-" || k.chars().all(|c| c.is_ascii_digit()))
                {
                    RedirOp::OutErr
                } else {
                    op
                };
                Ok(Redir { fd, op, target: w })
            }
            _ => Err(self.unexpected()),
        }
    }

    fn trailing_redirs(&mut self) -> Result<Vec<Redir>, SyntaxError> {
        let mut redirs = Vec::new();
        while let Some(Tok::Redir { fd, op }) = self.peek().cloned() {
            redirs.push(self.redirect(fd, op)?);
        }
        Ok(redirs)
    }

    fn command(&mut self) -> Result<Command, SyntaxError> {
        match self.peek() {
            Some(Tok::Op("(")) => {
                self.pos += 1;
                let body = self.list(&[")"])?;
                if self.peek() != Some(&Tok::Op(")")) {
                    return Err(self.unexpected());
                }
                self.pos += 1;
                let redirs = self.trailing_redirs()?;
                return Ok(Command::Group {
                    body,
                    subshell: true,
                    redirs,
                });
            }
            Some(Tok::Word(w)) => match w.as_keyword() {
                Some("{") => {
                    self.pos += 1;
                    let body = self.list(&["}"])?;
                    self.expect_kw("}")?;
                    let redirs = self.trailing_redirs()?;
                    return Ok(Command::Group {
                        body,
                        subshell: false,
                        redirs,
                    });
                }
                Some("for") => return self.for_cmd(),
                Some("while") | Some("until") => {
                    let until = w.as_keyword() == Some("until");
                    self.pos += 1;
                    let cond = self.list(&["do"])?;
                    self.expect_kw("do")?;
                    let body = self.list(&["done"])?;
                    self.expect_kw("done")?;
                    let redirs = self.trailing_redirs()?;
                    return Ok(Command::While {
                        cond,
                        body,
                        until,
                        redirs,
                    });
                }
                Some("if") => return self.if_cmd(),
                Some("case") | Some("function") | Some("select") => {
                    return Err(SyntaxError {
                        line: self.line(),
                        message: format!(
                            "`{}' is not supported by the virtual shell",
                            w.as_keyword().unwrap_or("")
                        ),
                        source_line: None,
                    })
                }
                Some(k) if RESERVED.contains(&k) && k != "!" && k != "in" => {
                    return Err(self.unexpected())
                }
                _ => {}
            },
            _ => {}
        }
        self.simple()
    }

    fn for_cmd(&mut self) -> Result<Command, SyntaxError> {
        self.pos += 1;
        let var = match self.peek() {
            Some(Tok::Word(w)) => match w.as_keyword() {
                Some(k)
                    if k.chars().next().is_some_and(is_name_start)
                        && k.chars().all(is_name_char) =>
                {
                    k.to_string()
                }
                _ => {
                    let k = w.as_keyword().unwrap_or("").to_string();
                    return Err(SyntaxError {
                        line: self.line(),
                        message: format!("`{k}': not a valid identifier"),
                        source_line: None,
                    });
                }
            },
            _ => return Err(self.unexpected()),
        };
        self.pos += 1;
        // Optional `in words`, then `;` or newline, then `do`.
        let mut items = None;
        self.skip_newlines();
        if self.is_kw("in") {
            self.pos += 1;
            let mut ws = Vec::new();
            while let Some(Tok::Word(w)) = self.peek() {
                ws.push(w.clone());
                self.pos += 1;
            }
            items = Some(ws);
            match self.peek() {
                Some(Tok::Op(";")) | Some(Tok::Op("\n")) => self.pos += 1,
                _ => return Err(self.unexpected()),
            }
        } else if matches!(self.peek(), Some(Tok::Op(";"))) {
            self.pos += 1;
        }
        self.skip_newlines();
        self.expect_kw("do")?;
        let body = self.list(&["done"])?;
        self.expect_kw("done")?;
        let redirs = self.trailing_redirs()?;
        Ok(Command::For {
            var,
            items,
            body,
            redirs,
        })
    }

    fn if_cmd(&mut self) -> Result<Command, SyntaxError> {
        self.pos += 1;
        let mut branches = Vec::new();
        let mut else_body = None;
        loop {
            let cond = self.list(&["then"])?;
            self.expect_kw("then")?;
            let body = self.list(&["elif", "else", "fi"])?;
            branches.push((cond, body));
            if self.is_kw("elif") {
                self.pos += 1;
                continue;
            }
            if self.is_kw("else") {
                self.pos += 1;
                else_body = Some(self.list(&["fi"])?);
            }
            self.expect_kw("fi")?;
            break;
        }
        let redirs = self.trailing_redirs()?;
        Ok(Command::If {
            branches,
            else_body,
            redirs,
        })
    }

    fn simple(&mut self) -> Result<Command, SyntaxError> {
        let line = self.line();
        let mut assigns = Vec::new();
        let mut words = Vec::new();
        let mut redirs = Vec::new();
        loop {
            match self.peek().cloned() {
                Some(Tok::Word(w)) => {
                    if words.is_empty() {
                        if let Some(a) = as_assignment(&w) {
                            assigns.push(a);
                            self.pos += 1;
                            continue;
                        }
                    }
                    words.push(w);
                    self.pos += 1;
                }
                Some(Tok::Redir { fd, op }) => redirs.push(self.redirect(fd, op)?),
                Some(Tok::Heredoc) => return Err(SyntaxError {
                    line: self.line(),
                    message:
                        "here-documents (`<<`) are not supported by the virtual shell; use `<<<`"
                            .into(),
                    source_line: None,
                }),
                _ => break,
            }
        }
        if words.is_empty() && assigns.is_empty() && redirs.is_empty() {
            return Err(self.unexpected());
        }
        Ok(Command::Simple {
            assigns,
            words,
            redirs,
            line,
        })
    }
}

fn redirs_of(c: &mut Command) -> &mut Vec<Redir> {
    match c {
        Command::Simple { redirs, .. }
        | Command::Group { redirs, .. }
        | Command::For { redirs, .. }
        | Command::While { redirs, .. }
        | Command::If { redirs, .. } => redirs,
    }
}

fn as_assignment(w: &Word) -> Option<Assign> {
    let Some(Seg::Lit {
        text,
        quoted: false,
    }) = w.segs.first()
    else {
        return None;
    };
    let eq = text.find('=')?;
    let name = &text[..eq];
    if name.is_empty()
        || !name.chars().next().is_some_and(is_name_start)
        || !name.chars().all(is_name_char)
    {
        return None;
    }
    let mut value = Word::default();
    let rest = &text[eq + 1..];
    if !rest.is_empty() {
        value.segs.push(Seg::Lit {
            text: rest.to_string(),
            quoted: false,
        });
    }
    value.segs.extend(w.segs[1..].iter().cloned());
    Some(Assign {
        name: name.to_string(),
        value,
    })
}

/// Parse a command line (possibly several lines).
pub fn parse(src: &str) -> Result<List, SyntaxError> {
    let toks = Lexer::new(src).tokens()?;
    let last_line = toks.last().map(|t| t.1).unwrap_or(1);
    let newlines = src.matches('\n').count();
    let eof_line = if src.ends_with('\n') {
        newlines + 1
    } else {
        newlines + 2
    };
    let mut p = Parser {
        toks,
        pos: 0,
        src_lines: src.lines().map(str::to_string).collect(),
        last_line,
        eof_line,
    };
    let list = p.list(&[])?;
    if p.pos < p.toks.len() {
        return Err(p.unexpected());
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lit(s: &str) -> Word {
        Word {
            segs: vec![Seg::Lit {
                text: s.into(),
                quoted: false,
            }],
        }
    }

    #[test]
    fn pipeline_and_or() {
        let l = parse("grep -rn 'rate limit' / | head && echo ok || echo no; pwd").unwrap();
        assert_eq!(l.items.len(), 2);
        assert_eq!(l.items[0].first.cmds.len(), 2);
        assert_eq!(l.items[0].rest.len(), 2);
        match &l.items[0].first.cmds[0] {
            Command::Simple { words, .. } => {
                assert_eq!(
                    words[2],
                    Word {
                        segs: vec![Seg::Lit {
                            text: "rate limit".into(),
                            quoted: true
                        }]
                    }
                );
            }
            c => panic!("{c:?}"),
        }
    }

    #[test]
    fn redirections() {
        let l = parse("cat x 2>/dev/null >out 2>&1").unwrap();
        let Command::Simple { redirs, .. } = &l.items[0].first.cmds[0] else {
            panic!()
        };
        assert_eq!(redirs.len(), 3);
        assert_eq!(
            redirs[0],
            Redir {
                fd: 2,
                op: RedirOp::Out,
                target: lit("/dev/null")
            }
        );
        assert_eq!(redirs[2].op, RedirOp::Dup);
    }

    #[test]
    fn quoting_and_vars() {
        let l = parse(r#"echo "a $HOME b" '$x' \* "" x=1"#).unwrap();
        let Command::Simple { words, .. } = &l.items[0].first.cmds[0] else {
            panic!()
        };
        assert_eq!(words.len(), 6);
        assert!(matches!(&words[1].segs[1], Seg::Var { name, quoted: true } if name == "HOME"));
        assert_eq!(
            words[3],
            Word {
                segs: vec![Seg::Lit {
                    text: "*".into(),
                    quoted: true
                }]
            }
        );
        assert_eq!(
            words[4],
            Word {
                segs: vec![Seg::Lit {
                    text: "".into(),
                    quoted: true
                }]
            }
        );
    }

    #[test]
    fn compound() {
        parse("for f in *.md; do echo $f; done").unwrap();
        parse("if grep -q x a; then echo y; elif true; then :; else echo n; fi").unwrap();
        parse("while false; do echo; done").unwrap();
        parse("(cd docs && ls) ; { ls; }").unwrap();
    }

    #[test]
    fn syntax_errors_like_bash() {
        let e = parse("ls |").unwrap_err();
        assert_eq!(
            e.to_string(),
            "bash: -c: line 2: syntax error: unexpected end of file\n"
        );
        let e = parse("| ls").unwrap_err();
        assert_eq!(
            e.to_string(),
            "bash: -c: line 1: syntax error near unexpected token `|'\nbash: -c: line 1: `| ls'\n"
        );
        let e = parse("echo 'abc").unwrap_err();
        assert!(e
            .to_string()
            .contains("unexpected EOF while looking for matching `''"));
    }
}
