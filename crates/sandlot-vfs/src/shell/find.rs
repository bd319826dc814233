//! `find` (GNU findutils 4.9 behaviour) over a view.

use super::cmd_files::{lquote, vstat, DIR_SIZE};
use super::exec::{Abort, Ctx};
use crate::glob::{MatchOptions, Pattern};
use crate::manifest::NodeId;

#[derive(Debug, Clone)]
enum Cmp {
    Lt(u64),
    Eq(u64),
    Gt(u64),
}

impl Cmp {
    fn test(&self, v: u64) -> bool {
        match *self {
            Cmp::Lt(n) => v < n,
            Cmp::Eq(n) => v == n,
            Cmp::Gt(n) => v > n,
        }
    }
}

#[derive(Debug, Clone)]
enum Expr {
    True,
    False,
    Name(Pattern, bool),
    Path(Pattern, bool),
    Type(Vec<char>),
    Size(Cmp, u64),
    Empty,
    Mtime(Cmp, i64),
    Print,
    Print0,
    Printf(String),
    Prune,
    Quit,
    Delete,
    Exec {
        argv: Vec<String>,
        batch: bool,
        id: usize,
    },
    Not(Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Comma(Box<Expr>, Box<Expr>),
}

impl Expr {
    /// Whether `-delete` appears anywhere (it implies `-depth`).
    fn has_delete(&self) -> bool {
        match self {
            Expr::Delete => true,
            Expr::Not(e) => e.has_delete(),
            Expr::And(a, b) | Expr::Or(a, b) | Expr::Comma(a, b) => {
                a.has_delete() || b.has_delete()
            }
            _ => false,
        }
    }

    fn has_action(&self) -> bool {
        match self {
            Expr::Print
            | Expr::Print0
            | Expr::Printf(_)
            | Expr::Exec { .. }
            | Expr::Delete
            | Expr::Quit => true,
            Expr::Not(e) => e.has_action(),
            Expr::And(a, b) | Expr::Or(a, b) | Expr::Comma(a, b) => {
                a.has_action() || b.has_action()
            }
            _ => false,
        }
    }
}

struct Parser<'a> {
    args: &'a [String],
    pos: usize,
    maxdepth: Option<usize>,
    mindepth: usize,
    depth_first: bool,
    execs: usize,
    last_pred: String,
}

type PResult<T> = Result<T, String>;

fn parse_cmp(s: &str) -> Option<(char, &str)> {
    match s.chars().next()? {
        '+' => Some(('+', &s[1..])),
        '-' => Some(('-', &s[1..])),
        _ => Some(('=', s)),
    }
}

impl Parser<'_> {
    fn peek(&self) -> Option<&str> {
        self.args.get(self.pos).map(String::as_str)
    }

    fn arg(&mut self, pred: &str) -> PResult<String> {
        match self.args.get(self.pos) {
            Some(a) => {
                self.pos += 1;
                Ok(a.clone())
            }
            None => Err(format!("find: missing argument to `{pred}'")),
        }
    }

    fn or(&mut self) -> PResult<Expr> {
        let mut left = self.and()?;
        loop {
            match self.peek() {
                Some("-o") | Some("-or") => {
                    self.pos += 1;
                    let right = self.and()?;
                    left = Expr::Or(Box::new(left), Box::new(right));
                }
                Some(",") => {
                    self.pos += 1;
                    let right = self.and()?;
                    left = Expr::Comma(Box::new(left), Box::new(right));
                }
                _ => return Ok(left),
            }
        }
    }

    fn and(&mut self) -> PResult<Expr> {
        let mut left = self.unary()?;
        loop {
            match self.peek() {
                None | Some("-o") | Some("-or") | Some(")") | Some(",") => return Ok(left),
                Some("-a") | Some("-and") => {
                    self.pos += 1;
                    let right = self.unary()?;
                    left = Expr::And(Box::new(left), Box::new(right));
                }
                _ => {
                    let right = self.unary()?;
                    left = Expr::And(Box::new(left), Box::new(right));
                }
            }
        }
    }

    fn unary(&mut self) -> PResult<Expr> {
        match self.peek() {
            Some("!") | Some("-not") => {
                self.pos += 1;
                Ok(Expr::Not(Box::new(self.unary()?)))
            }
            Some("(") => {
                self.pos += 1;
                let e = self.or()?;
                if self.peek() != Some(")") {
                    return Err("find: invalid expression; I was expecting to find a ')' somewhere but did not see one.".into());
                }
                self.pos += 1;
                Ok(e)
            }
            Some(")") => Err("find: invalid expression; you have too many ')'".into()),
            None => Err("find: invalid expression".into()),
            Some(_) => self.primary(),
        }
    }

    fn primary(&mut self) -> PResult<Expr> {
        let tok = self.arg("")?;
        let prev = std::mem::replace(&mut self.last_pred, tok.clone());
        if !tok.starts_with('-') || tok == "-" {
            let mut msg = format!("find: paths must precede expression: `{tok}'");
            if matches!(
                prev.as_str(),
                "-name" | "-iname" | "-path" | "-ipath" | "-wholename" | "-iwholename"
            ) {
                msg.push_str(&format!(
                    "\nfind: possible unquoted pattern after predicate `{prev}'?"
                ));
            }
            return Err(msg);
        }
        Ok(match tok.as_str() {
            "-name" | "-iname" => {
                let p = self.arg(&tok)?;
                Expr::Name(Pattern::new(&p), tok == "-iname")
            }
            "-path" | "-ipath" | "-wholename" | "-iwholename" => {
                let p = self.arg(&tok)?;
                Expr::Path(Pattern::new(&p), tok.starts_with("-i"))
            }
            "-type" | "-xtype" => {
                let t = self.arg(&tok)?;
                let mut v = Vec::new();
                for part in t.split(',') {
                    let mut cs = part.chars();
                    match (cs.next(), cs.next()) {
                        (Some(c @ ('f' | 'd' | 'l' | 'b' | 'c' | 'p' | 's' | 'D')), None) => {
                            v.push(c)
                        }
                        _ => return Err(format!("find: Unknown argument to {tok}: {part}")),
                    }
                }
                Expr::Type(v)
            }
            "-size" => {
                let s = self.arg(&tok)?;
                let (sign, rest) = parse_cmp(&s)
                    .ok_or_else(|| format!("find: invalid argument `{s}' to `-size'"))?;
                let digits_end = rest
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(rest.len());
                let n: u64 = rest[..digits_end]
                    .parse()
                    .map_err(|_| format!("find: invalid argument `{s}' to `-size'"))?;
                let unit = match &rest[digits_end..] {
                    "" | "b" => 512,
                    "c" => 1,
                    "w" => 2,
                    "k" => 1024,
                    "M" => 1 << 20,
                    "G" => 1 << 30,
                    u => return Err(format!("find: invalid -size type `{u}'")),
                };
                let cmp = match sign {
                    '+' => Cmp::Gt(n),
                    '-' => Cmp::Lt(n),
                    _ => Cmp::Eq(n),
                };
                Expr::Size(cmp, unit)
            }
            "-mtime" | "-mmin" => {
                let s = self.arg(&tok)?;
                let (sign, rest) = parse_cmp(&s)
                    .ok_or_else(|| format!("find: invalid argument `{s}' to `{tok}'"))?;
                let n: u64 = rest
                    .parse()
                    .map_err(|_| format!("find: invalid argument `{s}' to `{tok}'"))?;
                let unit = if tok == "-mtime" { 86_400 } else { 60 };
                let cmp = match sign {
                    '+' => Cmp::Gt(n),
                    '-' => Cmp::Lt(n),
                    _ => Cmp::Eq(n),
                };
                Expr::Mtime(cmp, unit)
            }
            "-empty" => Expr::Empty,
            "-true" | "-readable" => Expr::True,
            "-false" | "-writable" => Expr::False,
            "-print" => Expr::Print,
            "-print0" => Expr::Print0,
            "-printf" => Expr::Printf(self.arg(&tok)?),
            "-prune" => Expr::Prune,
            "-quit" => Expr::Quit,
            "-delete" => Expr::Delete,
            "-maxdepth" | "-mindepth" => {
                let v = self.arg(&tok)?;
                let n: usize = v.parse().map_err(|_| {
                    format!(
                        "find: Expected a positive decimal integer argument to {tok}, but got {}",
                        lquote(&v)
                    )
                })?;
                if tok == "-maxdepth" {
                    self.maxdepth = Some(n);
                } else {
                    self.mindepth = n;
                }
                Expr::True
            }
            "-depth" | "-d" => {
                self.depth_first = true;
                Expr::True
            }
            "-noleaf" | "-xdev" | "-mount" | "-ignore_readdir_race" | "-follow" => Expr::True,
            "-exec" | "-ok" | "-execdir" | "-okdir" => {
                let mut argv = Vec::new();
                loop {
                    match self.args.get(self.pos) {
                        None => return Err(format!("find: missing argument to `{tok}'")),
                        Some(a) if a == ";" => {
                            self.pos += 1;
                            break;
                        }
                        Some(a) if a == "+" && argv.last().is_some_and(|l: &String| l == "{}") => {
                            self.pos += 1;
                            argv.pop();
                            self.execs += 1;
                            return Ok(Expr::Exec {
                                argv,
                                batch: true,
                                id: self.execs,
                            });
                        }
                        Some(a) => {
                            argv.push(a.clone());
                            self.pos += 1;
                        }
                    }
                }
                if argv.is_empty() {
                    return Err(format!("find: missing argument to `{tok}'"));
                }
                self.execs += 1;
                Expr::Exec {
                    argv,
                    batch: false,
                    id: self.execs,
                }
            }
            "-regex" | "-iregex" | "-newer" | "-perm" | "-user" | "-group" | "-links" | "-inum"
            | "-ls" | "-fprint" => {
                return Err(format!("find: {tok} is not supported by the virtual shell"))
            }
            _ => return Err(format!("find: unknown predicate `{tok}'")),
        })
    }
}

struct Walker {
    maxdepth: Option<usize>,
    mindepth: usize,
    depth_first: bool,
    quit: bool,
    status: i32,
    batches: Vec<(Vec<String>, Vec<String>)>,
    now: i64,
}

struct Visit<'a> {
    node: NodeId,
    path: &'a str,
    start: &'a str,
    depth: usize,
}

fn basename(path: &str) -> &str {
    let t = path.trim_end_matches('/');
    if t.is_empty() {
        return "/";
    }
    t.rsplit('/').next().unwrap_or(t)
}

fn printf_fmt(ctx: &Ctx, fmt: &str, v: &Visit) -> Vec<u8> {
    let st = vstat(ctx, v.node);
    let mut out = Vec::new();
    let b: Vec<char> = fmt.chars().collect();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        i += 1;
        if c == '\\' && i < b.len() {
            let e = b[i];
            i += 1;
            match e {
                'n' => out.push(b'\n'),
                't' => out.push(b'\t'),
                '0' => out.push(0),
                '\\' => out.push(b'\\'),
                'r' => out.push(b'\r'),
                other => {
                    out.push(b'\\');
                    out.extend_from_slice(other.to_string().as_bytes());
                }
            }
            continue;
        }
        if c != '%' || i >= b.len() {
            out.extend_from_slice(c.to_string().as_bytes());
            continue;
        }
        let d = b[i];
        i += 1;
        let s = match d {
            '%' => "%".to_string(),
            'p' => v.path.to_string(),
            'f' => basename(v.path).to_string(),
            'h' => match v.path.trim_end_matches('/').rfind('/') {
                Some(0) => "/".into(),
                Some(k) => v.path[..k].to_string(),
                None => ".".into(),
            },
            'P' => {
                let rest = &v.path[v.start.len().min(v.path.len())..];
                rest.trim_start_matches('/').to_string()
            }
            's' => st.size.to_string(),
            'd' => v.depth.to_string(),
            'y' => if st.is_dir { "d" } else { "f" }.to_string(),
            'm' => if st.is_dir { "555" } else { "444" }.to_string(),
            'M' => if st.is_dir {
                "dr-xr-xr-x"
            } else {
                "-r--r--r--"
            }
            .to_string(),
            'n' => st.nlink.to_string(),
            'u' | 'g' => "root".into(),
            'U' | 'G' => "0".into(),
            'k' => (st.blocks / 2).to_string(),
            'b' => st.blocks.to_string(),
            'T' if i < b.len() && b[i] == '@' => {
                i += 1;
                format!("{}.0000000000", st.mtime)
            }
            other => format!("%{other}"),
        };
        out.extend_from_slice(s.as_bytes());
    }
    out
}

impl Walker {
    fn eval(
        &mut self,
        ctx: &mut Ctx,
        e: &Expr,
        v: &Visit,
        prune: &mut bool,
    ) -> Result<bool, Abort> {
        Ok(match e {
            Expr::True => true,
            Expr::False => false,
            Expr::Name(p, ci) => {
                let o = MatchOptions {
                    casefold: *ci,
                    ..Default::default()
                };
                p.matches(basename(v.path), o)
            }
            Expr::Path(p, ci) => p.matches(
                v.path,
                MatchOptions {
                    casefold: *ci,
                    ..Default::default()
                },
            ),
            Expr::Type(ts) => {
                let c = if ctx.fs().is_dir(v.node) { 'd' } else { 'f' };
                ts.contains(&c)
            }
            Expr::Size(cmp, unit) => {
                let st = vstat(ctx, v.node);
                let size = if st.is_dir { DIR_SIZE } else { st.size };
                cmp.test(size.div_ceil(*unit))
            }
            Expr::Empty => {
                if ctx.fs().is_dir(v.node) {
                    ctx.fs().children(v.node).is_empty()
                } else {
                    vstat(ctx, v.node).size == 0
                }
            }
            Expr::Mtime(cmp, unit) => {
                let age = (self.now - vstat(ctx, v.node).mtime).max(0) as u64;
                cmp.test(age / *unit as u64)
            }
            Expr::Print => {
                ctx.outs(v.path)?;
                ctx.outs("\n")?;
                true
            }
            Expr::Print0 => {
                ctx.outs(v.path)?;
                ctx.out(&[0])?;
                true
            }
            Expr::Printf(f) => {
                let b = printf_fmt(ctx, f, v);
                ctx.out(&b)?;
                true
            }
            Expr::Prune => {
                *prune = true;
                true
            }
            Expr::Quit => {
                self.quit = true;
                true
            }
            Expr::Delete if ctx.fs().writable() => {
                // GNU find never deletes the starting point ".".
                if v.path == "." {
                    return Ok(true);
                }
                let fs = ctx.fs();
                let why = if fs.is_dir(v.node) && !fs.children(v.node).is_empty() {
                    Some(super::vpath::FsErr::NotEmpty)
                } else {
                    super::cmd_write::with_scratch(ctx, |view, sc| sc.remove(view, v.node)).err()
                };
                match why {
                    None => true,
                    Some(e) => {
                        ctx.flush()?;
                        ctx.errln(&format!(
                            "find: cannot delete {}: {}",
                            lquote(v.path),
                            e.msg()
                        ))?;
                        self.status = 1;
                        false
                    }
                }
            }
            Expr::Delete => {
                ctx.flush()?;
                ctx.errln(&format!(
                    "find: cannot delete {}: Read-only file system",
                    lquote(v.path)
                ))?;
                self.status = 1;
                false
            }
            Expr::Exec { argv, batch, id } => {
                if *batch {
                    match self
                        .batches
                        .iter_mut()
                        .find(|b| b.0 == *argv && b.1.first().is_some_and(|x| x == &id.to_string()))
                    {
                        Some(b) => b.1.push(v.path.to_string()),
                        None => self
                            .batches
                            .push((argv.clone(), vec![id.to_string(), v.path.to_string()])),
                    }
                    true
                } else {
                    let a: Vec<String> = argv.iter().map(|x| x.replace("{}", v.path)).collect();
                    let s = ctx.run_child(&a, Vec::new())?;
                    s == 0
                }
            }
            Expr::Not(x) => !self.eval(ctx, x, v, prune)?,
            Expr::And(a, b) => self.eval(ctx, a, v, prune)? && self.eval(ctx, b, v, prune)?,
            Expr::Or(a, b) => self.eval(ctx, a, v, prune)? || self.eval(ctx, b, v, prune)?,
            Expr::Comma(a, b) => {
                self.eval(ctx, a, v, prune)?;
                self.eval(ctx, b, v, prune)?
            }
        })
    }

    fn visit(
        &mut self,
        ctx: &mut Ctx,
        e: &Expr,
        node: NodeId,
        path: &str,
        start: &str,
        depth: usize,
    ) -> Result<(), Abort> {
        ctx.check()?;
        if self.quit {
            return Ok(());
        }
        let v = Visit {
            node,
            path,
            start,
            depth,
        };
        let mut prune = false;
        let in_range = depth >= self.mindepth && self.maxdepth.is_none_or(|m| depth <= m);
        if !self.depth_first && in_range {
            self.eval(ctx, e, &v, &mut prune)?;
        }
        let descend = ctx.fs().is_dir(node) && !prune && self.maxdepth.is_none_or(|m| depth < m);
        if descend {
            let kids: Vec<NodeId> = ctx.fs().children(node).to_vec();
            for c in kids {
                if self.quit {
                    break;
                }
                let name = ctx.fs().name(c).to_string();
                let child = if path.ends_with('/') {
                    format!("{path}{name}")
                } else {
                    format!("{path}/{name}")
                };
                self.visit(ctx, e, c, &child, start, depth + 1)?;
            }
        }
        if self.depth_first && in_range && !self.quit {
            self.eval(ctx, e, &v, &mut prune)?;
        }
        Ok(())
    }
}

pub(crate) fn find(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    let mut i = 0;
    let mut starts = Vec::new();
    while i < args.len() {
        let a = &args[i];
        if (a.starts_with('-') && a.len() > 1) || a == "(" || a == "!" {
            break;
        }
        starts.push(a.clone());
        i += 1;
    }
    if starts.is_empty() {
        starts.push(".".into());
    }
    let mut p = Parser {
        args: &args[i..],
        pos: 0,
        maxdepth: None,
        mindepth: 0,
        depth_first: false,
        execs: 0,
        last_pred: String::new(),
    };
    let expr = if p.args.is_empty() {
        Ok(Expr::True)
    } else {
        p.or().and_then(|e| {
            if p.pos < p.args.len() {
                if p.args[p.pos] == ")" {
                    Err("find: invalid expression; you have too many ')'".into())
                } else {
                    Err(format!(
                        "find: unexpected extra predicate '{}'",
                        p.args[p.pos]
                    ))
                }
            } else {
                Ok(e)
            }
        })
    };
    let expr = match expr {
        Ok(e) => e,
        Err(msg) => {
            ctx.errln(&msg)?;
            return Ok(1);
        }
    };
    let expr = if expr.has_action() {
        expr
    } else {
        Expr::And(Box::new(expr), Box::new(Expr::Print))
    };
    let mut w = Walker {
        maxdepth: p.maxdepth,
        mindepth: p.mindepth,
        depth_first: p.depth_first || expr.has_delete(),
        quit: false,
        status: 0,
        batches: Vec::new(),
        now: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0),
    };
    for s in &starts {
        if w.quit {
            break;
        }
        match ctx.resolve(s) {
            Ok(n) => w.visit(ctx, &expr, n, s, s, 0)?,
            Err(e) => {
                ctx.flush()?;
                ctx.errln(&format!("find: {}: {}", lquote(s), e.msg()))?;
                w.status = 1;
            }
        }
    }
    for (argv, mut paths) in std::mem::take(&mut w.batches) {
        paths.remove(0);
        let mut a = argv.clone();
        a.extend(paths);
        let s = ctx.run_child(&a, Vec::new())?;
        if s != 0 {
            w.status = 1;
        }
    }
    Ok(w.status)
}
