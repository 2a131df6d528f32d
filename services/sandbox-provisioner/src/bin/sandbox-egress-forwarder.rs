//! `sandbox-egress-forwarder ADDR=SOCKET... -- COMMAND...`: runs inside a sandbox's own
//! network namespace. It listens on each TCP `ADDR` (the sandbox's loopback), relays
//! every connection to its Unix socket `SOCKET` (the provisioner's egress proxy, the LLM
//! relay), and runs COMMAND, exiting with its status. The sandbox has no other way out.
//!
//! `sandbox-egress-forwarder [ADDR=SOCKET...] --init -- SELF...`: the same listeners,
//! and the sandbox's init on the control socket it has as stdin
//! (`forkyard_sandbox_provisioner::local::isolation::init`); SELF starts this binary again (a pty command
//! runs under `SELF --ctty -- COMMAND...`, which makes the terminal its controlling one).
#![forbid(unsafe_code)]

use forkyard_sandbox_provisioner::local::isolation::init;
use std::{
    io,
    net::{TcpListener, TcpStream},
    os::{fd::AsFd, unix::net::UnixStream},
    process::{Command, ExitCode},
    thread,
};

const USAGE: &str = "usage: sandbox-egress-forwarder ADDR=SOCKET... -- COMMAND...
       sandbox-egress-forwarder [ADDR=SOCKET...] --init -- SELF...
       sandbox-egress-forwarder --ctty -- COMMAND...";

fn usage() -> ExitCode {
    eprintln!("{USAGE}");
    ExitCode::from(125)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(sep) = args.iter().position(|a| a == "--") else {
        return usage();
    };
    let (opts, cmd) = (&args[..sep], &args[sep + 1..]);
    if cmd.is_empty() {
        return usage();
    }
    if opts == ["--ctty"] {
        return init::ctty::exec_on_ctty(cmd);
    }
    let (pairs, init) = match opts {
        [pairs @ .., flag] if flag == "--init" => (pairs, true),
        pairs if !pairs.is_empty() => (pairs, false),
        _ => return usage(),
    };
    for pair in pairs {
        if let Err(code) = listen(pair) {
            return code;
        }
    }
    if init {
        let Ok(sock) = io::stdin().as_fd().try_clone_to_owned() else {
            eprintln!("sandbox init: no control socket on stdin");
            return ExitCode::from(125);
        };
        return init::guest::run(sock, cmd.to_vec());
    }
    let status = match Command::new(&cmd[0]).args(&cmd[1..]).status() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{}: {e}", cmd[0]);
            return ExitCode::from(if e.kind() == io::ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };
    ExitCode::from(u8::try_from(init::guest::code_of(status)).unwrap_or(1))
}

/// Listen on `pair`'s address (`<addr>=<socket>`), each connection relayed to the Unix
/// socket on a thread of its own; `Err`: the exit code.
fn listen(pair: &str) -> Result<(), ExitCode> {
    let Some((addr, socket)) = pair.split_once('=') else {
        return Err(usage());
    };
    let listener = match TcpListener::bind(addr) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("egress forwarder: cannot listen on {addr}: {e}");
            return Err(ExitCode::from(125));
        }
    };
    let socket = socket.to_owned();
    // Threads may be refused (the sandbox at its pids limit): a connection then
    // fails, never the forwarder.
    let listening = thread::Builder::new().spawn(move || {
        for conn in listener.incoming().flatten() {
            let socket = socket.clone();
            let _ = thread::Builder::new().spawn(move || relay(conn, &socket));
        }
    });
    if let Err(e) = listening {
        eprintln!("egress forwarder: cannot listen on {addr}: {e}");
        return Err(ExitCode::from(125));
    }
    Ok(())
}

fn relay(tcp: TcpStream, socket: &str) {
    let Ok(unix) = UnixStream::connect(socket) else {
        return;
    };
    let _ = tcp.set_nodelay(true);
    let (Ok(mut tcp_r), Ok(mut unix_w)) = (tcp.try_clone(), unix.try_clone()) else {
        return;
    };
    let Ok(up) = thread::Builder::new().spawn(move || {
        let _ = io::copy(&mut tcp_r, &mut unix_w);
        let _ = unix_w.shutdown(std::net::Shutdown::Write);
    }) else {
        return;
    };
    let (mut unix_r, mut tcp_w) = (unix, tcp);
    let _ = io::copy(&mut unix_r, &mut tcp_w);
    let _ = tcp_w.shutdown(std::net::Shutdown::Write);
    let _ = up.join();
}
