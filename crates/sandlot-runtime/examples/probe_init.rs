use std::io::{BufRead, BufReader, Write};
use sandlot_runtime::init::{self, AgentStart};
use sandlot_runtime::{Backend, CreateOptions, NamespaceBackend, RuntimeConfig};

fn agent(a: AgentStart) -> std::io::Result<()> {
    for conn in a.listener.incoming() {
        let mut conn = conn?;
        let mut line = String::new();
        BufReader::new(&conn).read_line(&mut line)?;
        let out = std::process::Command::new("/bin/sh").arg("-c").arg(line.trim()).env_clear().envs(a.setup.env.iter().cloned()).output();
        match out {
            Ok(o) => { conn.write_all(&o.stdout)?; conn.write_all(&o.stderr)?; writeln!(conn, "exit={:?}", o.status)?; }
            Err(e) => { writeln!(conn, "spawn error {e}")?; }
        }
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(|s| s.as_str()) == Some("__init") {
        init::main(agent);
    }
    let be = NamespaceBackend::new(RuntimeConfig::new(std::env::current_exe().unwrap())).unwrap();
    let mut spec = sandlot_proto::spec::SandboxSpec::default();
    if let Some(r) = std::env::var_os("ROOTFS") { spec.rootfs = Some(r.to_string_lossy().into()); }
    let t = std::time::Instant::now();
    let sb = be.create("probe1", &spec, CreateOptions { lifeline: None, stderr: Some(std::io::stderr().as_fd().try_clone_to_owned().unwrap()) });
    use std::os::fd::AsFd;
    let sb = match sb { Ok(s) => s, Err(e) => { eprintln!("create failed: {e}"); std::process::exit(1) } };
    eprintln!("created in {:?} pid {}", t.elapsed(), sb.pid);
    let mut c = std::os::unix::net::UnixStream::connect(&sb.socket).unwrap();
    writeln!(c, "{}", args[1..].join(" ")).unwrap();
    let mut s = String::new();
    std::io::Read::read_to_string(&mut c, &mut s).ok();
    print!("{s}");
    be.terminate(&sb).unwrap();
}
