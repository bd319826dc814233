//! Execution of parsed command lines: expansion, globbing, redirections,
//! pipelines, control flow and the shell builtins.

use std::time::Instant;

use super::overlay::{self, Fs, Scratch};
use super::parse::{self, AndOr, Command, Conn, List, Pipeline, Redir, RedirOp, Seg, Word};
use super::vpath::{self, FsErr};
use super::{Limits, Output, ShellState};
use crate::glob::{MatchOptions, Pattern};
use crate::manifest::{NodeId, ROOT};
use crate::store::View;

/// Why execution stopped early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Abort {
    Timeout,
    OutputFull,
    PipeLimit,
    /// The reader of a pipe stopped reading (`| head`): the writer ends quietly,
    /// as a real process would on SIGPIPE.
    BrokenPipe,
    StepLimit,
    /// A write to a scratch file hit the scratch area's size limit (ENOSPC);
    /// the command that wrote ends with GNU's write-error diagnostic.
    NoSpace,
    Exit(i32),
    Break(u32),
    Continue(u32),
}

/// Where a file descriptor writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sink {
    Stdout,
    Stderr,
    Pipe(usize),
    Null,
    /// A file in the session's scratch area (opened by a redirection).
    File(NodeId),
}

/// The I/O a command inherits.
#[derive(Debug, Clone)]
struct IoCtx {
    out: Sink,
    err: Sink,
    stdin: Option<Vec<u8>>,
    /// stdin comes from a redirected regular file (affects `wc` widths).
    stdin_file: bool,
}

pub(crate) struct Exec<'v> {
    pub view: &'v View,
    /// The session's scratch area, if it has one (writes go there).
    pub scratch: Option<&'v mut Scratch>,
    pub st: ShellState,
    limits: &'v Limits,
    deadline: Instant,
    steps: u64,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    truncated: bool,
    pipes: Vec<Vec<u8>>,
    /// Per pipe: how much the reader will consume at most (lines or bytes).
    /// With the newlines already written to that pipe.
    pipe_caps: Vec<Option<(PipeCap, usize)>>,
}

/// What a pipe's reader (`head -n N` / `head -c N`) will consume at most.
#[derive(Debug, Clone, Copy)]
enum PipeCap {
    Lines(usize),
    Bytes(usize),
}

/// If `cmd` is a plain `head` reading stdin, how much of it it reads.
fn head_cap(cmd: &Command) -> Option<PipeCap> {
    let Command::Simple {
        words,
        redirs,
        assigns,
        ..
    } = cmd
    else {
        return None;
    };
    if !redirs.is_empty() || !assigns.is_empty() {
        return None;
    }
    let args: Vec<&str> = words
        .iter()
        .map(|w| w.as_keyword())
        .collect::<Option<Vec<_>>>()?;
    if args.first() != Some(&"head") {
        return None;
    }
    let num = |s: &str| s.parse::<usize>().ok();
    match &args[1..] {
        [] => Some(PipeCap::Lines(10)),
        [n] if n.starts_with('-') && n.len() > 1 => num(&n[1..]).map(PipeCap::Lines),
        ["-n", n] => num(n).map(PipeCap::Lines),
        [n] if n.starts_with("-n") => num(&n[2..]).map(PipeCap::Lines),
        ["-c", n] => num(n).map(PipeCap::Bytes),
        [n] if n.starts_with("-c") => num(&n[2..]).map(PipeCap::Bytes),
        _ => None,
    }
}

/// The context a command runs in.
pub(crate) struct Ctx<'a, 'v> {
    pub ex: &'a mut Exec<'v>,
    out: Sink,
    err: Sink,
    stdin: Option<Vec<u8>>,
    stdin_used: bool,
    pub stdin_file: bool,
    pending: Vec<u8>,
    /// Line of the command, for `bash: line N:` messages.
    pub line: usize,
}

const STDIO_BUFSIZ: usize = 4096;

/// `head -n 0`/`-c 0` still reads nothing; any positive cap stops the writer once met.
fn cap_reached(cap: PipeCap) -> bool {
    match cap {
        PipeCap::Lines(n) | PipeCap::Bytes(n) => n > 0,
    }
}

impl Exec<'_> {
    fn write(&mut self, sink: Sink, data: &[u8]) -> Result<(), Abort> {
        match sink {
            Sink::Null => Ok(()),
            Sink::File(id) => match self.scratch.as_deref_mut() {
                Some(sc) => match sc.write(self.view, id, data, true) {
                    Ok(()) => Ok(()),
                    Err(FsErr::NoSpace) => Err(Abort::NoSpace),
                    // Removed while open: the bytes go to an unlinked file.
                    Err(_) => Ok(()),
                },
                None => Ok(()),
            },
            Sink::Pipe(i) => {
                if self.pipes[i].len() + data.len() > self.limits.max_pipe_bytes {
                    return Err(Abort::PipeLimit);
                }
                let before = self.pipes[i].len();
                self.pipes[i].extend_from_slice(data);
                if let Some(Some((cap, seen))) = self.pipe_caps.get_mut(i) {
                    if !cap_reached(*cap) {
                        return Ok(());
                    }
                    let buf = &mut self.pipes[i];
                    let cut = match *cap {
                        PipeCap::Bytes(n) => (buf.len() >= n).then_some(n),
                        PipeCap::Lines(n) => {
                            let mut cut = None;
                            for (k, b) in data.iter().enumerate() {
                                if *b == b'\n' {
                                    *seen += 1;
                                    if *seen == n {
                                        cut = Some(before + k + 1);
                                        break;
                                    }
                                }
                            }
                            cut
                        }
                    };
                    if let Some(c) = cut {
                        buf.truncate(c);
                        return Err(Abort::BrokenPipe);
                    }
                }
                Ok(())
            }
            Sink::Stdout | Sink::Stderr => {
                let used = self.stdout.len() + self.stderr.len();
                let room = self.limits.max_output_bytes.saturating_sub(used);
                let take = room.min(data.len());
                let buf = if sink == Sink::Stdout {
                    &mut self.stdout
                } else {
                    &mut self.stderr
                };
                buf.extend_from_slice(&data[..take]);
                if take < data.len() {
                    self.truncated = true;
                    return Err(Abort::OutputFull);
                }
                Ok(())
            }
        }
    }

    fn check(&self) -> Result<(), Abort> {
        if Instant::now() >= self.deadline {
            Err(Abort::Timeout)
        } else {
            Ok(())
        }
    }

    fn step(&mut self) -> Result<(), Abort> {
        self.steps += 1;
        if self.steps > self.limits.max_steps {
            return Err(Abort::StepLimit);
        }
        self.check()
    }
}

impl Ctx<'_, '_> {
    /// Write to standard output (stdio-style buffered, like GNU tools).
    pub fn out(&mut self, b: &[u8]) -> Result<(), Abort> {
        self.pending.extend_from_slice(b);
        if self.pending.len() >= STDIO_BUFSIZ {
            let n = self.pending.len() / STDIO_BUFSIZ * STDIO_BUFSIZ;
            let chunk: Vec<u8> = self.pending.drain(..n).collect();
            self.ex.write(self.out, &chunk)?;
        }
        Ok(())
    }

    /// Write a string to standard output.
    pub fn outs(&mut self, s: &str) -> Result<(), Abort> {
        self.out(s.as_bytes())
    }

    /// Write to standard error (unbuffered).
    pub fn err(&mut self, b: &[u8]) -> Result<(), Abort> {
        self.ex.write(self.err, b)
    }

    /// Write one diagnostic line to standard error.
    pub fn errln(&mut self, s: &str) -> Result<(), Abort> {
        let mut v = s.as_bytes().to_vec();
        v.push(b'\n');
        self.err(&v)
    }

    /// Flush buffered standard output.
    pub fn flush(&mut self) -> Result<(), Abort> {
        if !self.pending.is_empty() {
            let chunk = std::mem::take(&mut self.pending);
            self.ex.write(self.out, &chunk)?;
        }
        Ok(())
    }

    /// Fail if the time budget is spent.
    pub fn check(&self) -> Result<(), Abort> {
        self.ex.check()
    }

    /// Standard input, consumed.
    pub fn take_stdin(&mut self) -> Vec<u8> {
        self.stdin_used = true;
        self.stdin.take().unwrap_or_default()
    }

    /// The session's files: its tree merged with its scratch area.
    pub fn fs(&self) -> Fs<'_> {
        self.ex.fs()
    }

    /// The view and the scratch area, when the session has one.
    pub fn scratch(&mut self) -> Option<(&View, &mut Scratch)> {
        let view = self.ex.view;
        self.ex.scratch.as_deref_mut().map(|s| (view, s))
    }

    /// The scratch file standard output goes to, if any.
    pub fn out_file(&self) -> Option<NodeId> {
        match self.out {
            Sink::File(n) => Some(n),
            _ => None,
        }
    }

    pub fn view(&self) -> &View {
        self.ex.view
    }

    pub fn cwd(&self) -> NodeId {
        self.ex.st.cwd
    }

    pub fn resolve(&self, path: &str) -> Result<NodeId, FsErr> {
        vpath::resolve(&self.fs(), self.ex.st.cwd, path)
    }

    /// Read a file node's content.
    pub fn read(&self, node: NodeId) -> Result<Vec<u8>, FsErr> {
        self.fs().read(node)
    }

    /// Open a path for reading: resolve, refuse directories, read.
    pub fn read_path(&self, path: &str) -> Result<Vec<u8>, FsErr> {
        let n = self.resolve(path)?;
        self.read(n)
    }

    /// Run another command (for `find -exec`, `xargs`) with the given stdin,
    /// writing to this command's outputs.
    pub fn run_child(&mut self, argv: &[String], stdin: Vec<u8>) -> Result<i32, Abort> {
        self.flush()?;
        self.ex.step()?;
        let io = IoCtx {
            out: self.out,
            err: self.err,
            stdin: Some(stdin),
            stdin_file: false,
        };
        let line = self.line;
        let mut used = false;
        self.ex.dispatch(argv, &io, line, &mut used)
    }
}

type CmdFn = fn(&mut Ctx, &[String]) -> Result<i32, Abort>;

fn command_fn(name: &str) -> Option<CmdFn> {
    Some(match name {
        "ls" => super::cmd_files::ls,
        "cat" => super::cmd_files::cat,
        "head" => super::cmd_files::head,
        "tail" => super::cmd_files::tail,
        "wc" => super::cmd_files::wc,
        "tree" => super::cmd_files::tree,
        "find" => super::find::find,
        "grep" => super::grep::grep,
        "egrep" => super::grep::egrep,
        "fgrep" => super::grep::fgrep,
        "rg" => super::rg::rg,
        "sort" => super::cmd_sort::sort,
        "uniq" => super::cmd_text::uniq,
        "cut" => super::cmd_text::cut,
        "tr" => super::cmd_text::tr,
        "basename" => super::cmd_text::basename,
        "dirname" => super::cmd_text::dirname,
        "xargs" => super::cmd_text::xargs,
        "seq" => super::cmd_text::seq,
        "printf" => super::cmd_text::printf,
        "touch" => super::cmd_write::touch,
        "mkdir" => super::cmd_write::mkdir,
        "rm" => super::cmd_write::rm,
        "rmdir" => super::cmd_write::rmdir,
        "cp" => super::cmd_write::cp,
        "mv" => super::cmd_write::mv,
        "ln" => super::cmd_write::ln,
        "chmod" => super::cmd_write::chmod,
        "chown" => super::cmd_write::chown,
        "truncate" => super::cmd_write::truncate,
        "tee" => super::cmd_write::tee,
        _ => return None,
    })
}

const BUILTINS: [&str; 14] = [
    "cd", "pwd", "echo", "true", "false", ":", "exit", "export", "unset", "test", "[", "break",
    "continue", "type",
];

/// Run a command line to completion.
pub(crate) fn run_line(
    view: &View,
    scratch: Option<&mut Scratch>,
    st: &mut ShellState,
    limits: &Limits,
    line: &str,
    start: Instant,
) -> Output {
    let mut ex = Exec {
        view,
        scratch,
        st: st.clone(),
        limits,
        deadline: start + limits.max_run_time,
        steps: 0,
        stdout: Vec::new(),
        stderr: Vec::new(),
        truncated: false,
        pipes: Vec::new(),
        pipe_caps: Vec::new(),
    };
    let status = match parse::parse(line) {
        Err(e) => {
            let _ = ex.write(Sink::Stderr, e.to_string().as_bytes());
            e.status()
        }
        Ok(list) => {
            let io = IoCtx {
                out: Sink::Stdout,
                err: Sink::Stderr,
                stdin: Some(Vec::new()),
                stdin_file: false,
            };
            match ex.run_list(&list, &io) {
                Ok(s) => s,
                Err(Abort::Exit(s)) => s,
                Err(Abort::NoSpace) => 1,
                Err(Abort::Break(_)) | Err(Abort::Continue(_)) => ex.st.last_status,
                Err(Abort::BrokenPipe) => 141,
                Err(Abort::Timeout) => {
                    let secs = limits.max_run_time.as_secs_f64();
                    ex.stderr.extend_from_slice(
                        format!("sandlot: command timed out after {secs}s\n").as_bytes(),
                    );
                    124
                }
                Err(Abort::OutputFull) => {
                    ex.stderr.extend_from_slice(
                        format!(
                            "sandlot: output truncated at {} bytes\n",
                            limits.max_output_bytes
                        )
                        .as_bytes(),
                    );
                    141
                }
                Err(Abort::PipeLimit) => {
                    ex.stderr.extend_from_slice(
                        format!(
                            "sandlot: pipe buffer limit of {} bytes exceeded\n",
                            limits.max_pipe_bytes
                        )
                        .as_bytes(),
                    );
                    141
                }
                Err(Abort::StepLimit) => {
                    ex.stderr.extend_from_slice(
                        format!(
                            "sandlot: limit of {} commands per command line exceeded\n",
                            limits.max_steps
                        )
                        .as_bytes(),
                    );
                    1
                }
            }
        }
    };
    ex.st.last_status = status;
    *st = ex.st;
    Output {
        stdout: ex.stdout,
        stderr: ex.stderr,
        exit_code: status,
        truncated: ex.truncated,
        duration: Default::default(),
    }
}

impl Exec<'_> {
    pub(crate) fn fs(&self) -> Fs<'_> {
        Fs::new(self.view, self.scratch.as_deref())
    }

    fn run_list(&mut self, list: &List, io: &IoCtx) -> Result<i32, Abort> {
        let mut status = self.st.last_status;
        let mut io = io.clone();
        for item in &list.items {
            status = self.run_and_or(item, &mut io)?;
        }
        Ok(status)
    }

    fn run_and_or(&mut self, ao: &AndOr, io: &mut IoCtx) -> Result<i32, Abort> {
        let mut status = self.run_pipeline(&ao.first, io)?;
        for (conn, p) in &ao.rest {
            let run = match conn {
                Conn::And => status == 0,
                Conn::Or => status != 0,
            };
            if run {
                status = self.run_pipeline(p, io)?;
            }
        }
        Ok(status)
    }

    fn run_pipeline(&mut self, p: &Pipeline, io: &mut IoCtx) -> Result<i32, Abort> {
        let status = if p.cmds.len() == 1 {
            let mut used = false;
            let s = self.run_command(&p.cmds[0], io, &mut used)?;
            if used {
                io.stdin = Some(Vec::new());
            }
            s
        } else {
            let mut input = io.stdin.take();
            let mut input_file = io.stdin_file;
            let mut status = 0;
            for (i, cmd) in p.cmds.iter().enumerate() {
                let last = i + 1 == p.cmds.len();
                let out = if last {
                    io.out
                } else {
                    self.pipes.push(Vec::new());
                    self.pipe_caps
                        .push(head_cap(&p.cmds[i + 1]).map(|c| (c, 0)));
                    Sink::Pipe(self.pipes.len() - 1)
                };
                let sub = IoCtx {
                    out,
                    err: io.err,
                    stdin: input.take(),
                    stdin_file: input_file,
                };
                // Each stage runs in a subshell: state changes do not persist.
                let saved = self.st.clone();
                let mut used = false;
                let r = self.run_command(cmd, &sub, &mut used);
                self.st = saved;
                status = match r {
                    Ok(s) | Err(Abort::Exit(s)) => s,
                    Err(Abort::Break(_)) | Err(Abort::Continue(_)) => 0,
                    Err(Abort::BrokenPipe) => 141,
                    Err(e) => return Err(e),
                };
                if let Sink::Pipe(idx) = out {
                    input = Some(std::mem::take(&mut self.pipes[idx]));
                    if idx + 1 == self.pipes.len() {
                        self.pipes.pop();
                        self.pipe_caps.pop();
                    }
                }
                input_file = false;
            }
            io.stdin = Some(Vec::new());
            status
        };
        let status = if p.negate {
            i32::from(status == 0)
        } else {
            status
        };
        self.st.last_status = status;
        Ok(status)
    }

    /// Apply redirections; on failure the message is written and Err(status) returned.
    fn redirect(
        &mut self,
        redirs: &[Redir],
        io: &IoCtx,
        line: usize,
    ) -> Result<Result<IoCtx, i32>, Abort> {
        let mut io = io.clone();
        for r in redirs {
            let target = if r.op == RedirOp::HereString {
                vec![self.expand_single(&r.target)]
            } else {
                self.expand_word(&r.target)
            };
            if target.len() != 1 {
                let raw = word_source(&r.target);
                self.write(
                    io.err,
                    format!("bash: line {line}: {raw}: ambiguous redirect\n").as_bytes(),
                )?;
                return Ok(Err(1));
            }
            let t = &target[0];
            let sink_for = |fd: u32, io: &IoCtx| match fd {
                0 => None,
                1 => Some(io.out),
                2 => Some(io.err),
                _ => None,
            };
            match r.op {
                RedirOp::HereString => {
                    let mut data = t.clone().into_bytes();
                    data.push(b'\n');
                    if r.fd == 0 {
                        io.stdin = Some(data);
                        io.stdin_file = false;
                    }
                }
                RedirOp::In => {
                    if r.fd != 0 {
                        continue;
                    }
                    if t == "/dev/null" {
                        io.stdin = Some(Vec::new());
                        io.stdin_file = false;
                        continue;
                    }
                    let fs = self.fs();
                    let res = vpath::resolve(&fs, self.st.cwd, t).and_then(|n| fs.read(n));
                    match res {
                        Ok(d) => {
                            io.stdin = Some(d);
                            io.stdin_file = true;
                        }
                        Err(FsErr::IsDir) => {
                            // bash opens directories fine; reading then fails in the command.
                            io.stdin = Some(Vec::new());
                            io.stdin_file = false;
                        }
                        Err(e) => {
                            self.write(
                                io.err,
                                format!("bash: line {line}: {t}: {}\n", e.msg()).as_bytes(),
                            )?;
                            return Ok(Err(1));
                        }
                    }
                }
                RedirOp::Dup => {
                    let sink = if t == "-" {
                        Some(Sink::Null)
                    } else {
                        match t.parse::<u32>() {
                            Ok(fd) => sink_for(fd, &io),
                            Err(_) => None,
                        }
                    };
                    let Some(sink) = sink else {
                        self.write(
                            io.err,
                            format!("bash: line {line}: {t}: Bad file descriptor\n").as_bytes(),
                        )?;
                        return Ok(Err(1));
                    };
                    match r.fd {
                        1 => io.out = sink,
                        2 => io.err = sink,
                        _ => {}
                    }
                }
                RedirOp::Out | RedirOp::Append | RedirOp::OutErr | RedirOp::AppendErr => {
                    let sink = match t.as_str() {
                        "/dev/null" => Sink::Null,
                        "/dev/stdout" => io.out,
                        "/dev/stderr" => io.err,
                        _ => {
                            let append = matches!(r.op, RedirOp::Append | RedirOp::AppendErr);
                            match self.open_for_writing(t, append) {
                                Ok(n) => Sink::File(n),
                                Err(why) => {
                                    self.write(
                                        io.err,
                                        format!("bash: line {line}: {t}: {}\n", why.msg())
                                            .as_bytes(),
                                    )?;
                                    return Ok(Err(1));
                                }
                            }
                        }
                    };
                    match r.op {
                        RedirOp::OutErr | RedirOp::AppendErr => {
                            io.out = sink;
                            io.err = sink;
                        }
                        _ => match r.fd {
                            1 => io.out = sink,
                            2 => io.err = sink,
                            _ => {}
                        },
                    }
                }
            }
        }
        Ok(Ok(io))
    }

    /// Open `t` for a `>` (truncate) or `>>` (append) redirection: create it in
    /// the scratch area if needed. Without one, fail as on a read-only mount.
    fn open_for_writing(&mut self, t: &str, append: bool) -> Result<NodeId, FsErr> {
        let cwd = self.st.cwd;
        let fs = self.fs();
        let tg = overlay::target(&fs, cwd, t)?;
        if tg.slash || tg.node.is_some_and(|n| fs.is_dir(n)) {
            return Err(FsErr::IsDir);
        }
        let view = self.view;
        let Some(sc) = self.scratch.as_deref_mut() else {
            return Err(FsErr::ReadOnly);
        };
        match tg.node {
            Some(n) if append => Ok(n),
            Some(n) => sc.write(view, n, &[], false).map(|()| n),
            None => sc.create_file(view, tg.dir, &tg.name),
        }
    }

    fn run_command(&mut self, cmd: &Command, io: &IoCtx, used: &mut bool) -> Result<i32, Abort> {
        match cmd {
            Command::Simple {
                assigns,
                words,
                redirs,
                line,
            } => {
                self.step()?;
                let mut argv = Vec::new();
                for w in words {
                    argv.extend(self.expand_word(w));
                }
                let values: Vec<(String, String)> = assigns
                    .iter()
                    .map(|a| (a.name.clone(), self.expand_single(&a.value)))
                    .collect();
                let io2 = match self.redirect(redirs, io, *line)? {
                    Ok(io2) => io2,
                    Err(status) => return Ok(status),
                };
                if argv.is_empty() {
                    for (k, v) in values {
                        self.st.vars.insert(k, v);
                    }
                    return Ok(0);
                }
                self.dispatch(&argv, &io2, *line, used)
            }
            Command::Group {
                body,
                subshell,
                redirs,
            } => {
                let io2 = match self.redirect(redirs, io, 0)? {
                    Ok(io2) => io2,
                    Err(status) => return Ok(status),
                };
                if *subshell {
                    let saved = self.st.clone();
                    let r = self.run_list(body, &io2);
                    self.st = saved;
                    match r {
                        Err(Abort::Exit(s)) => Ok(s),
                        other => other,
                    }
                } else {
                    self.run_list(body, &io2)
                }
            }
            Command::For {
                var,
                items,
                body,
                redirs,
            } => {
                let io2 = match self.redirect(redirs, io, 0)? {
                    Ok(io2) => io2,
                    Err(status) => return Ok(status),
                };
                let values: Vec<String> = match items {
                    Some(ws) => ws.iter().flat_map(|w| self.expand_word(w)).collect(),
                    None => Vec::new(),
                };
                let mut status = 0;
                for v in values {
                    self.step()?;
                    self.st.vars.insert(var.clone(), v);
                    match self.run_list(body, &io2) {
                        Ok(s) => status = s,
                        Err(Abort::Break(n)) => {
                            if n > 1 {
                                return Err(Abort::Break(n - 1));
                            }
                            break;
                        }
                        Err(Abort::Continue(n)) => {
                            if n > 1 {
                                return Err(Abort::Continue(n - 1));
                            }
                        }
                        Err(e) => return Err(e),
                    }
                }
                Ok(status)
            }
            Command::While {
                cond,
                body,
                until,
                redirs,
            } => {
                let io2 = match self.redirect(redirs, io, 0)? {
                    Ok(io2) => io2,
                    Err(status) => return Ok(status),
                };
                let mut status = 0;
                loop {
                    self.step()?;
                    let c = self.run_list(cond, &io2)?;
                    if (c == 0) == *until {
                        break;
                    }
                    match self.run_list(body, &io2) {
                        Ok(s) => status = s,
                        Err(Abort::Break(n)) => {
                            if n > 1 {
                                return Err(Abort::Break(n - 1));
                            }
                            break;
                        }
                        Err(Abort::Continue(n)) => {
                            if n > 1 {
                                return Err(Abort::Continue(n - 1));
                            }
                        }
                        Err(e) => return Err(e),
                    }
                }
                Ok(status)
            }
            Command::If {
                branches,
                else_body,
                redirs,
            } => {
                let io2 = match self.redirect(redirs, io, 0)? {
                    Ok(io2) => io2,
                    Err(status) => return Ok(status),
                };
                for (cond, body) in branches {
                    if self.run_list(cond, &io2)? == 0 {
                        return self.run_list(body, &io2);
                    }
                }
                match else_body {
                    Some(b) => self.run_list(b, &io2),
                    None => Ok(0),
                }
            }
        }
    }

    fn dispatch(
        &mut self,
        argv: &[String],
        io: &IoCtx,
        line: usize,
        used: &mut bool,
    ) -> Result<i32, Abort> {
        let name = argv[0].as_str();
        let f: Option<CmdFn> = if BUILTINS.contains(&name) {
            None
        } else {
            command_fn(name)
        };
        let is_builtin = BUILTINS.contains(&name);
        if f.is_none() && !is_builtin {
            let msg = if name.contains('/') {
                let fs = self.fs();
                match vpath::resolve(&fs, self.st.cwd, name) {
                    Ok(n) if fs.is_dir(n) => {
                        self.write(
                            io.err,
                            format!("bash: line {line}: {name}: Is a directory\n").as_bytes(),
                        )?;
                        return Ok(126);
                    }
                    Ok(_) => {
                        self.write(
                            io.err,
                            format!("bash: line {line}: {name}: Permission denied\n").as_bytes(),
                        )?;
                        return Ok(126);
                    }
                    Err(e) => format!("bash: line {line}: {name}: {}\n", e.msg()),
                }
            } else {
                format!("bash: line {line}: {name}: command not found\n")
            };
            self.write(io.err, msg.as_bytes())?;
            return Ok(127);
        }
        let mut ctx = Ctx {
            out: io.out,
            err: io.err,
            stdin: io.stdin.clone(),
            stdin_used: false,
            stdin_file: io.stdin_file,
            pending: Vec::new(),
            line,
            ex: self,
        };
        let res = match f {
            Some(f) => f(&mut ctx, &argv[1..]),
            None => builtin(&mut ctx, name, &argv[1..]),
        };
        // Flush what the command wrote even if it stopped early.
        let flushed = ctx.flush();
        *used = ctx.stdin_used;
        if matches!(res, Err(Abort::NoSpace)) || matches!(flushed, Err(Abort::NoSpace)) {
            let (msg, status) = no_space(name, line, f.is_none());
            match self.write(io.err, msg.as_bytes()) {
                // Standard error is the full file too: the message is lost, as with GNU.
                Ok(()) | Err(Abort::NoSpace) => {}
                Err(e) => return Err(e),
            }
            return Ok(status);
        }
        let status = res?;
        flushed?;
        Ok(status)
    }

    // ---------- expansion ----------

    fn var(&self, name: &str) -> String {
        match name {
            "?" => self.st.last_status.to_string(),
            "#" => "0".into(),
            "$" => "1".into(),
            "PWD" => self.st.pwd.clone(),
            "OLDPWD" => self.st.oldpwd.clone().unwrap_or_default(),
            _ => self.st.vars.get(name).cloned().unwrap_or_default(),
        }
    }

    /// Expand without field splitting or globbing.
    fn expand_single(&self, w: &Word) -> String {
        let mut s = String::new();
        for seg in &w.segs {
            match seg {
                Seg::Lit { text, .. } => s.push_str(text),
                Seg::Var { name, .. } => s.push_str(&self.var(name)),
            }
        }
        s
    }

    /// Expand into fields: variables, field splitting of unquoted expansions,
    /// tilde, and pathname expansion.
    pub(crate) fn expand_word(&self, w: &Word) -> Vec<String> {
        let mut fields: Vec<Vec<(char, bool)>> = Vec::new();
        let mut cur: Vec<(char, bool)> = Vec::new();
        let mut cur_real = false; // has content or a quoted empty string
        for (i, seg) in w.segs.iter().enumerate() {
            match seg {
                Seg::Lit { text, quoted } => {
                    if *quoted {
                        cur_real = true;
                    }
                    for (j, c) in text.chars().enumerate() {
                        if i == 0 && j == 0 && c == '~' && !quoted {
                            let next = text.chars().nth(1);
                            if next.is_none() || next == Some('/') {
                                cur.extend(self.var("HOME").chars().map(|c| (c, true)));
                                cur_real = true;
                                continue;
                            }
                        }
                        cur.push((c, *quoted));
                        cur_real = true;
                    }
                }
                Seg::Var { name, quoted } => {
                    let v = self.var(name);
                    if *quoted {
                        cur.extend(v.chars().map(|c| (c, true)));
                        cur_real = true;
                    } else {
                        let mut first = true;
                        let starts_ws = v.starts_with([' ', '\t', '\n']);
                        for piece in v.split([' ', '\t', '\n']).filter(|p| !p.is_empty()) {
                            if !first || (starts_ws && cur_real) {
                                fields.push(std::mem::take(&mut cur));
                            }
                            cur.extend(piece.chars().map(|c| (c, false)));
                            cur_real = true;
                            first = false;
                        }
                        if v.ends_with([' ', '\t', '\n']) && cur_real && !first {
                            fields.push(std::mem::take(&mut cur));
                            cur_real = false;
                        }
                    }
                }
            }
        }
        if cur_real {
            fields.push(cur);
        }
        let mut out = Vec::new();
        for f in fields {
            let has_glob = f.iter().any(|(c, q)| !q && matches!(c, '*' | '?' | '['));
            if has_glob {
                let matches = self.glob(&f);
                if !matches.is_empty() {
                    out.extend(matches);
                    continue;
                }
            }
            out.push(f.iter().map(|(c, _)| *c).collect());
        }
        out
    }

    /// Pathname expansion against the view, bash semantics (dotglob off, globskipdots).
    fn glob(&self, pat: &[(char, bool)]) -> Vec<String> {
        let tree = self.fs();
        let mut comps: Vec<&[(char, bool)]> = Vec::new();
        let mut start = 0;
        for i in 0..=pat.len() {
            if i == pat.len() || pat[i].0 == '/' {
                comps.push(&pat[start..i]);
                start = i + 1;
            }
        }
        let absolute = pat.first().map(|c| c.0) == Some('/');
        let mut cands: Vec<(String, NodeId)> = vec![(
            if absolute {
                "/".to_string()
            } else {
                String::new()
            },
            if absolute { ROOT } else { self.st.cwd },
        )];
        let first = usize::from(absolute);
        let opts = MatchOptions {
            period: true,
            pathname: true,
            casefold: false,
        };
        let n = comps.len();
        for (ci, comp) in comps.iter().enumerate().skip(first) {
            let last = ci + 1 == n;
            if comp.is_empty() {
                if last {
                    // Trailing slash: keep directories only, display with '/'.
                    cands.retain(|(_, node)| tree.is_dir(*node));
                } else {
                    for c in &mut cands {
                        c.0.push('/');
                    }
                }
                continue;
            }
            let p = Pattern::from_chars(comp, false);
            let mut next = Vec::new();
            for (prefix, node) in &cands {
                if !tree.is_dir(*node) {
                    continue;
                }
                let sep = |s: &mut String| {
                    if !last {
                        s.push('/');
                    }
                };
                match p.literal() {
                    Some(lit) => {
                        let child = match lit.as_str() {
                            "." => Some(*node),
                            ".." => Some(tree.parent(*node)),
                            name => tree.child(*node, name),
                        };
                        if let Some(c) = child {
                            let mut s = format!("{prefix}{lit}");
                            sep(&mut s);
                            next.push((s, c));
                        }
                    }
                    None => {
                        for &c in tree.children(*node) {
                            let name = tree.name(c);
                            if p.matches(name, opts) {
                                let mut s = format!("{prefix}{name}");
                                sep(&mut s);
                                next.push((s, c));
                            }
                        }
                    }
                }
            }
            cands = next;
            if cands.is_empty() {
                break;
            }
        }
        let mut out: Vec<String> = cands.into_iter().map(|(s, _)| s).collect();
        out.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        out
    }
}

/// GNU's diagnostic when standard output hits ENOSPC, and the exit status.
fn no_space(prog: &str, line: usize, builtin: bool) -> (String, i32) {
    const E: &str = "No space left on device";
    match prog {
        _ if builtin || prog == "printf" => {
            (format!("bash: line {line}: {prog}: write error: {E}\n"), 1)
        }
        "head" | "tail" => (format!("{prog}: error writing 'standard output': {E}\n"), 1),
        "tee" => (format!("tee: 'standard output': {E}\n"), 1),
        "sort" => (
            format!("sort: write failed: 'standard output': {E}\nsort: write error\n"),
            2,
        ),
        "grep" | "egrep" | "fgrep" | "ls" | "rg" => (format!("{prog}: write error: {E}\n"), 2),
        _ => (format!("{prog}: write error: {E}\n"), 1),
    }
}

fn word_source(w: &Word) -> String {
    let mut s = String::new();
    for seg in &w.segs {
        match seg {
            Seg::Lit { text, .. } => s.push_str(text),
            Seg::Var { name, .. } => {
                s.push('$');
                s.push_str(name);
            }
        }
    }
    s
}

// ---------- builtins ----------

fn builtin(ctx: &mut Ctx, name: &str, args: &[String]) -> Result<i32, Abort> {
    let line = ctx.line;
    match name {
        "true" | ":" | "export" => Ok(0),
        "false" => Ok(1),
        "unset" => {
            for a in args {
                ctx.ex.st.vars.remove(a);
            }
            Ok(0)
        }
        "exit" => {
            let code = match args.first() {
                None => ctx.ex.st.last_status,
                Some(a) => match a.parse::<i64>() {
                    Ok(n) => (n & 0xff) as i32,
                    Err(_) => {
                        ctx.errln(&format!(
                            "bash: line {line}: exit: {a}: numeric argument required"
                        ))?;
                        2
                    }
                },
            };
            ctx.flush()?;
            Err(Abort::Exit(code))
        }
        "break" | "continue" => {
            let n = args
                .first()
                .and_then(|a| a.parse::<u32>().ok())
                .unwrap_or(1)
                .max(1);
            Err(if name == "break" {
                Abort::Break(n)
            } else {
                Abort::Continue(n)
            })
        }
        "pwd" => {
            let p = ctx.ex.st.pwd.clone();
            ctx.outs(&p)?;
            ctx.outs("\n")?;
            Ok(0)
        }
        "cd" => cd(ctx, args),
        "echo" => echo(ctx, args),
        "test" => super::cmd_text::test(ctx, args, false),
        "[" => super::cmd_text::test(ctx, args, true),
        "type" => {
            let mut status = 0;
            for a in args {
                if BUILTINS.contains(&a.as_str()) {
                    ctx.outs(&format!("{a} is a shell builtin\n"))?;
                } else if command_fn(a).is_some() {
                    ctx.outs(&format!("{a} is /usr/bin/{a}\n"))?;
                } else {
                    ctx.errln(&format!("bash: line {line}: type: {a}: not found"))?;
                    status = 1;
                }
            }
            Ok(status)
        }
        _ => Ok(127),
    }
}

fn cd(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    let line = ctx.line;
    let args: Vec<&String> = args.iter().filter(|a| *a != "-L" && *a != "-P").collect();
    if args.len() > 1 {
        ctx.errln(&format!("bash: line {line}: cd: too many arguments"))?;
        return Ok(1);
    }
    let mut print = false;
    let target = match args.first() {
        None => ctx
            .ex
            .st
            .vars
            .get("HOME")
            .cloned()
            .unwrap_or_else(|| "/".into()),
        Some(a) if a.as_str() == "-" => match ctx.ex.st.oldpwd.clone() {
            Some(o) => {
                print = true;
                o
            }
            None => {
                ctx.errln(&format!("bash: line {line}: cd: OLDPWD not set"))?;
                return Ok(1);
            }
        },
        Some(a) => (*a).clone(),
    };
    if target.is_empty() {
        return Ok(0);
    }
    match ctx.resolve(&target) {
        Ok(n) if ctx.fs().is_dir(n) => {
            let new = ctx.fs().path(n);
            let old = std::mem::replace(&mut ctx.ex.st.pwd, new.clone());
            ctx.ex.st.oldpwd = Some(old);
            ctx.ex.st.cwd = n;
            ctx.ex.st.vars.insert("PWD".into(), new.clone());
            if print {
                ctx.outs(&new)?;
                ctx.outs("\n")?;
            }
            Ok(0)
        }
        Ok(_) => {
            ctx.errln(&format!("bash: line {line}: cd: {target}: Not a directory"))?;
            Ok(1)
        }
        Err(e) => {
            ctx.errln(&format!("bash: line {line}: cd: {target}: {}", e.msg()))?;
            Ok(1)
        }
    }
}

/// Interpret backslash escapes (`echo -e`, `printf %b`). Returns (bytes, stop).
pub(crate) fn backslash_escapes(s: &str, octal_needs_zero: bool) -> (Vec<u8>, bool) {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' || i + 1 >= b.len() {
            out.push(b[i]);
            i += 1;
            continue;
        }
        i += 1;
        let c = b[i];
        i += 1;
        match c {
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'a' => out.push(7),
            b'b' => out.push(8),
            b'e' | b'E' => out.push(0x1b),
            b'f' => out.push(0x0c),
            b'v' => out.push(0x0b),
            b'\\' => out.push(b'\\'),
            b'c' => return (out, true),
            b'0'..=b'7' if c == b'0' || !octal_needs_zero => {
                let mut v: u32 = if c == b'0' && octal_needs_zero {
                    0
                } else {
                    u32::from(c - b'0')
                };
                let mut n = 0;
                while n < 3 && i < b.len() && (b'0'..=b'7').contains(&b[i]) {
                    v = v * 8 + u32::from(b[i] - b'0');
                    i += 1;
                    n += 1;
                }
                out.push((v & 0xff) as u8);
            }
            b'x' => {
                let mut v = 0u32;
                let mut n = 0;
                while n < 2 && i < b.len() && b[i].is_ascii_hexdigit() {
                    v = v * 16 + (b[i] as char).to_digit(16).unwrap_or(0);
                    i += 1;
                    n += 1;
                }
                if n == 0 {
                    out.extend_from_slice(b"\\x");
                } else {
                    out.push(v as u8);
                }
            }
            other => {
                out.push(b'\\');
                out.push(other);
            }
        }
    }
    (out, false)
}

fn echo(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    let mut newline = true;
    let mut escapes = false;
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if a.len() > 1 && a.starts_with('-') && a[1..].chars().all(|c| matches!(c, 'n' | 'e' | 'E'))
        {
            for c in a[1..].chars() {
                match c {
                    'n' => newline = false,
                    'e' => escapes = true,
                    _ => escapes = false,
                }
            }
            i += 1;
        } else {
            break;
        }
    }
    let mut out = Vec::new();
    for (k, a) in args[i..].iter().enumerate() {
        if k > 0 {
            out.push(b' ');
        }
        if escapes {
            let (b, stop) = backslash_escapes(a, true);
            out.extend(b);
            if stop {
                ctx.out(&out)?;
                return Ok(0);
            }
        } else {
            out.extend_from_slice(a.as_bytes());
        }
    }
    if newline {
        out.push(b'\n');
    }
    ctx.out(&out)?;
    Ok(0)
}
