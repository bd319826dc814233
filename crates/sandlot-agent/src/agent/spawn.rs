//! Starting a process: `clone(CLONE_VM | CLONE_VFORK)` and exec, like
//! `posix_spawn`, with the setup posix_spawn cannot do (switching user with
//! supplementary groups, a controlling terminal, resetting `oom_score_adj`).
//!
//! Why not `fork`: copying the agent's page tables and tearing them down again at
//! exec dominated the cost of an exec round trip. With `CLONE_VM` the child borrows
//! the agent's memory until it execs, while the agent (this thread) is suspended.
//!
//! The rules for the child, which runs on a private stack in shared memory:
//! everything is prepared before the clone; the child only makes raw system calls
//! (no allocation, no locks, no glibc wrappers that coordinate threads, like
//! `setuid`); it ends in `execve` or `_exit`, never by returning. All signals are
//! blocked around the clone so that no handler of the agent runs in the child
//! before the child has reset every disposition.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;

use sandlot_proto::guest::{ErrorBody, ErrorCode, PtySize};

use super::process::ExecPlan;

/// Size of the child's stack (touched only as far as used).
pub(crate) const CHILD_STACK: usize = 256 * 1024;

/// The step of the child setup that failed, reported through the error pipe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
enum Step {
    Stdio = 1,
    Signals,
    Setsid,
    Ctty,
    Groups,
    Gid,
    Uid,
    Chdir,
    Exec,
}

impl Step {
    fn from_u32(v: u32) -> Option<Step> {
        Some(match v {
            1 => Step::Stdio,
            2 => Step::Signals,
            3 => Step::Setsid,
            4 => Step::Ctty,
            5 => Step::Groups,
            6 => Step::Gid,
            7 => Step::Uid,
            8 => Step::Chdir,
            9 => Step::Exec,
            _ => return None,
        })
    }
}

/// Everything the child needs, as raw values that stay valid (owned by the
/// parent's stack frame) until the child has exec'd or exited.
struct ChildSpec {
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
    stdio: [RawFd; 3],
    /// Written by the child on failure (shared memory): step and errno.
    failure: *mut [u32; 2],
    /// Write 0 to the child's own `oom_score_adj` ([`ChildOomScore::Child`]).
    reset_oom: bool,
    tty: bool,
    switch_user: bool,
    uid: libc::uid_t,
    gid: libc::gid_t,
    groups: *const libc::gid_t,
    ngroups: usize,
}

impl ChildSpec {
    /// Runs in the child. Never returns.
    ///
    /// # Safety
    ///
    /// Only call in a `CLONE_VM | CLONE_VFORK` child, with every pointer valid (the
    /// parent is suspended until exec or exit).
    unsafe fn run(&self) -> ! {
        let fail = |step: Step| -> ! {
            // Reads errno; no allocation.
            let e = io::Error::last_os_error().raw_os_error().unwrap_or(0) as u32;
            // SAFETY: `failure` points into the suspended parent's frame, which reads
            // it only after this child has exited; _exit skips atexit handlers and
            // stdio flushing, which belong to the parent.
            unsafe {
                self.failure.write_volatile([step as u32, e]);
                libc::_exit(127)
            }
        };
        // SAFETY: raw system calls on values prepared by the parent; see the module
        // documentation for why nothing else may run here.
        unsafe {
            // Dispositions back to default (an all-zero kernel sigaction is SIG_DFL,
            // no flags, empty mask), including the real-time signals glibc keeps for
            // itself; then unblock everything.
            let dfl = [0u64; 8];
            for sig in 1..=64 {
                if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                    continue;
                }
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    dfl.as_ptr(),
                    std::ptr::null_mut::<u64>(),
                    8usize,
                );
            }
            let empty = 0u64;
            if libc::syscall(
                libc::SYS_rt_sigprocmask,
                libc::SIG_SETMASK,
                &empty as *const u64,
                std::ptr::null_mut::<u64>(),
                8usize,
            ) != 0
            {
                fail(Step::Signals);
            }
            for (target, &fd) in self.stdio.iter().enumerate() {
                // The parent made sure every source is >= 3, so dup2 always
                // creates a fresh descriptor without close-on-exec.
                if libc::dup2(fd, target as RawFd) < 0 {
                    fail(Step::Stdio);
                }
            }
            if libc::syscall(libc::SYS_setsid) < 0 {
                fail(Step::Setsid);
            }
            if self.tty && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                fail(Step::Ctty);
            }
            // The agent runs with a protective OOM score; its programs must not.
            if self.reset_oom {
                let fd = libc::open(
                    c"/proc/self/oom_score_adj".as_ptr(),
                    libc::O_WRONLY | libc::O_CLOEXEC,
                );
                if fd >= 0 {
                    libc::write(fd, b"0".as_ptr().cast(), 1);
                    libc::close(fd);
                }
            }
            if self.switch_user {
                if libc::syscall(libc::SYS_setgroups, self.ngroups, self.groups) != 0 {
                    fail(Step::Groups);
                }
                if libc::syscall(libc::SYS_setresgid, self.gid, self.gid, self.gid) != 0 {
                    fail(Step::Gid);
                }
                if libc::syscall(libc::SYS_setresuid, self.uid, self.uid, self.uid) != 0 {
                    fail(Step::Uid);
                }
            }
            if libc::chdir(self.cwd) != 0 {
                fail(Step::Chdir);
            }
            // Nothing the agent (or its host process) opened survives exec, even a
            // descriptor someone forgot to mark close-on-exec.
            libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
            libc::execve(self.program, self.argv, self.envp);
            fail(Step::Exec)
        }
    }
}

/// This thread's signal mask while it blocks every signal; the previous mask is
/// restored when dropped. (rustix has no signal masks.)
struct SignalsBlocked {
    old: libc::sigset_t,
}

impl SignalsBlocked {
    fn all() -> io::Result<SignalsBlocked> {
        let mut all = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        let mut old = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigfillset initialises the set it is given; pthread_sigmask reads
        // `all` and fills `old`, both valid for the call.
        let r = unsafe {
            libc::sigfillset(all.as_mut_ptr());
            libc::pthread_sigmask(libc::SIG_SETMASK, all.as_ptr(), old.as_mut_ptr())
        };
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        // SAFETY: pthread_sigmask succeeded, so it wrote the previous mask.
        let old = unsafe { old.assume_init() };
        Ok(SignalsBlocked { old })
    }
}

impl Drop for SignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: `old` is a mask pthread_sigmask returned; no old mask is asked for.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
    }
}

/// Starts `spec.run()` in a `CLONE_VM | CLONE_VFORK` child on `stack` (its top,
/// 16-byte aligned); returns once the child has exec'd or exited, with its pid.
/// (rustix has no `clone` with a function and stack.)
fn clone_vfork(spec: &ChildSpec, stack: &mut [u8]) -> io::Result<i32> {
    extern "C" fn child(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `arg` is the `ChildSpec` passed to clone below, alive in the
        // suspended parent's frame until exec or exit.
        let spec = unsafe { &*arg.cast_const().cast::<ChildSpec>() };
        // SAFETY: this is the CLONE_VM | CLONE_VFORK child with every pointer of
        // `spec` valid; it never returns.
        unsafe { spec.run() }
    }
    let end = stack.as_mut_ptr_range().end;
    let top = end.wrapping_sub(end as usize % 16);
    // SAFETY: CLONE_VFORK suspends this thread until the child has exec'd or
    // exited, so the shared memory is not used concurrently; the child runs on
    // `stack` (which outlives the call), follows the rules in the module
    // documentation and never returns from `child`.
    let pid = unsafe {
        libc::clone(
            child,
            top.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::from_ref(spec).cast_mut().cast(),
        )
    };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(pid)
}

/// A descriptor numbered at least 3 (so that dup2 onto 0..2 never aliases).
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    Ok(rustix::io::fcntl_dupfd_cloexec(&fd, 3)?)
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    Ok((above_stdio(r)?, above_stdio(w)?))
}

/// An input that reads as empty: /dev/null, or an empty pipe if the sandbox has none.
fn null_input() -> io::Result<OwnedFd> {
    match rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) {
        Ok(fd) => above_stdio(fd),
        Err(_) => Ok(pipe()?.0),
    }
}

pub(crate) fn open_pty(size: PtySize) -> io::Result<(OwnedFd, OwnedFd)> {
    use rustix::fs::{Mode, OFlags};
    use rustix::pty::OpenptFlags;
    let master =
        rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    let name = rustix::pty::ptsname(&master, Vec::new())?;
    let slave = rustix::fs::open(
        name.as_c_str(),
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    super::process::set_winsize(&master, size)?;
    Ok((above_stdio(master)?, above_stdio(slave)?))
}

/// The started child and the agent's ends of its stdio.
pub(crate) struct Spawned {
    pub pid: i32,
    pub stdout: OwnedFd,
    pub stderr: Option<OwnedFd>,
    /// Stdin pipe (not for terminals: the master is `stdout`).
    pub stdin: Option<OwnedFd>,
    pub tty: bool,
}

fn err(code: ErrorCode, msg: String) -> ErrorBody {
    ErrorBody::new(code, msg)
}

fn cstr(what: &str, s: &[u8]) -> Result<CString, ErrorBody> {
    CString::new(s).map_err(|_| {
        err(
            ErrorCode::BadRequest,
            format!("exec: {what} contains a NUL byte"),
        )
    })
}

/// How a child starts at an OOM score of 0 while the agent keeps its own
/// (protective) score.
pub(crate) enum ChildOomScore {
    /// Through the agent's own `oom_score_adj`, opened before the agent became
    /// non-dumpable: 0 while the child is cloned (it inherits the value), then the
    /// agent's score again.
    Agent(std::fs::File),
    /// The child writes 0 to its own `/proc/self/oom_score_adj`. A non-dumpable
    /// agent's children may not open that file, so this only works where the agent
    /// is dumpable (an agent run as an ordinary process); a failure is ignored.
    Child,
}

impl ChildOomScore {
    /// Sets the agent's score to 0 until the returned guard is dropped, if it is
    /// not 0 already and the agent holds its `oom_score_adj`.
    fn zero_for_child(&self) -> Option<AgentScoreRestore<'_>> {
        let ChildOomScore::Agent(file) = self else {
            return None;
        };
        let mut buf = [0u8; 16];
        let n = match file.read_at(&mut buf, 0) {
            Ok(n) => n,
            Err(e) => {
                super::log!("read the agent's oom_score_adj: {e}");
                return None;
            }
        };
        let score = buf[..n].trim_ascii();
        if score == b"0" {
            return None;
        }
        if let Err(e) = file.write_at(b"0", 0) {
            super::log!("set the agent's oom_score_adj to 0 for a child: {e}");
            return None;
        }
        Some(AgentScoreRestore {
            file,
            score: score.to_vec(),
        })
    }
}

/// Puts the agent's own OOM score back when dropped. The kernel lets an unprivileged
/// process lower its score back to the lowest one a privileged process gave it; if
/// it still refuses, the agent stays at 0 (and its children need no more resets).
struct AgentScoreRestore<'a> {
    file: &'a std::fs::File,
    score: Vec<u8>,
}

impl Drop for AgentScoreRestore<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.file.write_at(&self.score, 0) {
            super::log!(
                "restore the agent's oom_score_adj to {}: {e}; it stays at 0",
                String::from_utf8_lossy(&self.score)
            );
        }
    }
}

/// Starts `plan`. `stack` is the child's stack (reused across spawns).
pub(crate) fn spawn(
    plan: &ExecPlan,
    stack: &mut [u8],
    oom: &ChildOomScore,
) -> Result<Spawned, ErrorBody> {
    let name = &plan.argv[0];
    let me_root = rustix::process::geteuid().is_root();
    if !me_root
        && (plan.user.uid != rustix::process::getuid().as_raw()
            || plan.user.gid != rustix::process::getgid().as_raw())
    {
        return Err(err(
            ErrorCode::PermissionDenied,
            format!(
                "exec: cannot switch to uid {} gid {}: the agent is not running as root",
                plan.user.uid, plan.user.gid
            ),
        ));
    }
    // Everything the child reads, prepared here.
    let program = cstr("program", plan.program.as_os_str().as_bytes())?;
    let args: Vec<CString> = plan
        .argv
        .iter()
        .map(|a| cstr("argv", a.as_bytes()))
        .collect::<Result<_, _>>()?;
    let envs: Vec<CString> = plan
        .env
        .iter()
        .map(|(k, v)| cstr("env", format!("{k}={v}").as_bytes()))
        .collect::<Result<_, _>>()?;
    let cwd = cstr("cwd", plan.cwd.as_bytes())?;
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = envs.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    let groups: Vec<libc::gid_t> = plan.user.groups.clone();

    let io_err = |what: &str, e: io::Error| {
        err(
            ErrorCode::SpawnFailed,
            format!("exec {name:?}: {what}: {e}"),
        )
    };
    // Stdio: (child ends, agent ends).
    let (child_fds, out): ([OwnedFd; 3], Spawned) = match plan.pty {
        Some(size) => {
            let (m, s) = open_pty(size).map_err(|e| io_err("opening a terminal", e))?;
            let dup = |s: &OwnedFd| {
                s.try_clone()
                    .and_then(above_stdio)
                    .map_err(|e| io_err("dup", e))
            };
            let fds = [dup(&s)?, dup(&s)?, s];
            (
                fds,
                Spawned {
                    pid: 0,
                    stdout: m,
                    stderr: None,
                    stdin: None,
                    tty: true,
                },
            )
        }
        None => {
            let p = |_| pipe().map_err(|e| io_err("creating a pipe", e));
            let (in_r, in_w) = if plan.stdin {
                let (r, w) = p(())?;
                (r, Some(w))
            } else {
                (
                    null_input().map_err(|e| io_err("opening /dev/null", e))?,
                    None,
                )
            };
            let (out_r, out_w) = p(())?;
            let (err_r, err_w) = p(())?;
            (
                [in_r, out_w, err_w],
                Spawned {
                    pid: 0,
                    stdout: out_r,
                    stderr: Some(err_r),
                    stdin: in_w,
                    tty: false,
                },
            )
        }
    };
    let mut failure = [0u32; 2];
    let spec = ChildSpec {
        program: program.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        cwd: cwd.as_ptr(),
        stdio: [
            child_fds[0].as_raw_fd(),
            child_fds[1].as_raw_fd(),
            child_fds[2].as_raw_fd(),
        ],
        failure: &mut failure,
        reset_oom: matches!(oom, ChildOomScore::Child),
        tty: plan.pty.is_some(),
        switch_user: me_root,
        uid: plan.user.uid,
        gid: plan.user.gid,
        groups: groups.as_ptr(),
        ngroups: groups.len(),
    };

    // Block every signal so that none is handled in the child before it has reset
    // the dispositions; restore right after.
    let blocked = SignalsBlocked::all().map_err(|e| io_err("blocking signals", e))?;
    // The child inherits the agent's OOM score at the clone.
    let agent_score = oom.zero_for_child();
    let res = clone_vfork(&spec, stack);
    drop(agent_score);
    drop(blocked);
    drop(child_fds);
    let pid = match res {
        Ok(pid) => pid,
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
            return Err(err(
                ErrorCode::Limit,
                format!("exec {name:?}: the process limit is reached (clone: EAGAIN)"),
            ))
        }
        Err(e) => return Err(io_err("clone", e)),
    };

    // The child has exec'd, or failed and exited, writing why. Read through a
    // volatile pointer: the write happened in another task.
    // SAFETY: `failure` is a live local; the child is gone or has exec'd.
    let [step, errno] = unsafe { std::ptr::read_volatile(&failure) };
    if step != 0 {
        // It exited: collect it now, so that nobody else sees this pid.
        if let Some(pid) = rustix::process::Pid::from_raw(pid) {
            let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
        }
        let step = Step::from_u32(step);
        let errno = errno as i32;
        let e = io::Error::from_raw_os_error(errno);
        let (code, what) = match step {
            Some(Step::Exec) => (
                match errno {
                    libc::ENOENT => ErrorCode::NotFound,
                    libc::EACCES | libc::EPERM => ErrorCode::PermissionDenied,
                    _ => ErrorCode::SpawnFailed,
                },
                // Only the name as given (in the message below): the program found
                // through `PATH` is in a directory of `PATH`, which may be a secret.
                "executing it".to_string(),
            ),
            Some(Step::Chdir) => (
                ErrorCode::SpawnFailed,
                format!(
                    "changing to directory {} as uid {}",
                    plan.cwd, plan.user.uid
                ),
            ),
            Some(Step::Groups) | Some(Step::Gid) | Some(Step::Uid) => (
                ErrorCode::SpawnFailed,
                format!(
                    "switching to uid {} gid {} groups {:?}",
                    plan.user.uid, plan.user.gid, plan.user.groups
                ),
            ),
            Some(Step::Ctty) => (
                ErrorCode::SpawnFailed,
                "acquiring the controlling terminal".into(),
            ),
            other => (ErrorCode::SpawnFailed, format!("child setup ({other:?})")),
        };
        return Err(err(code, format!("exec {name:?}: {what}: {e}")));
    }
    Ok(Spawned { pid, ..out })
}
