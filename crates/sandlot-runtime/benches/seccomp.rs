//! The sandbox's seccomp filter installed in a forked child, as `compile` builds it
//! (a search over syscall numbers) against the same policy as one list searched in
//! order (`compile_as_list`), alternated, 200 of each: median and p10 of the
//! `prctl` that installs it, and their ratio. At install the kernel emulates the
//! filter once per system call number (its cache of always-allowed calls), so the
//! search shows there. Needs no privilege (`no_new_privs` is set first).
//!
//! Run: `cargo bench -p sandlot-runtime --bench seccomp`

use std::time::Instant;

use sandlot_runtime::seccomp::{compile, compile_as_list, default_policy, install, Insn};

/// Installs `prog` in a forked child; the child's time for it in nanoseconds.
fn install_in_child(prog: &[Insn]) -> u64 {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors `pipe` writes.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    let [r, w] = fds;
    // SAFETY: this program has one thread; the child only installs the filter,
    // writes eight bytes and `_exit`s.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let t = Instant::now();
        let ns = match install(prog) {
            Ok(()) => t.elapsed().as_nanos() as u64,
            Err(_) => u64::MAX,
        };
        // SAFETY: `w` is the pipe's open write end; `_exit` ends the child without
        // running the parent's destructors.
        unsafe {
            libc::write(w, ns.to_le_bytes().as_ptr().cast(), 8);
            libc::_exit(0)
        }
    }
    let mut b = [0u8; 8];
    // SAFETY: `r` is the pipe's open read end and `b` has room for 8 bytes; the
    // child is waited for once; both ends are closed once.
    let n = unsafe {
        libc::close(w);
        let n = libc::read(r, b.as_mut_ptr().cast(), 8);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
        libc::close(r);
        n
    };
    assert_eq!(n, 8, "the child wrote no time");
    let ns = u64::from_le_bytes(b);
    assert_ne!(ns, u64::MAX, "the child could not install the filter");
    ns
}

fn main() {
    let policy = default_policy();
    let tree = compile(&policy).expect("compile");
    let list = compile_as_list(&policy).expect("compile as a list");
    let (mut t, mut l) = (Vec::new(), Vec::new());
    for _ in 0..200 {
        t.push(install_in_child(&tree));
        l.push(install_in_child(&list));
    }
    t.sort_unstable();
    l.sort_unstable();
    let us = |v: &[u64], q: usize| v[v.len() * q / 100] as f64 / 1000.0;
    println!("filter            instructions  install p50 µs  p10 µs");
    println!(
        "search (compile)  {:>12}  {:>14.1}  {:>6.1}",
        tree.len(),
        us(&t, 50),
        us(&t, 10)
    );
    println!(
        "list in order     {:>12}  {:>14.1}  {:>6.1}",
        list.len(),
        us(&l, 50),
        us(&l, 10)
    );
    println!(
        "ratio of the medians, search / list: {:.2}",
        us(&t, 50) / us(&l, 50)
    );
}
