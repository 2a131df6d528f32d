//! `sandbox-egress-forwarder ADDR SOCKET -- COMMAND...`: runs inside a sandbox's own
//! network namespace. It listens on TCP `ADDR` (the sandbox's loopback), relays every
//! connection to the provisioner's egress proxy on the Unix socket `SOCKET`, and runs
//! COMMAND, exiting with its status. The sandbox has no other way out.
#![forbid(unsafe_code)]

use std::{
    io,
    net::{TcpListener, TcpStream},
    os::unix::{net::UnixStream, process::ExitStatusExt},
    process::{Command, ExitCode},
    thread,
};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (addr, socket, cmd) = match args.as_slice() {
        [addr, socket, sep, cmd @ ..] if sep == "--" && !cmd.is_empty() => (addr, socket, cmd),
        _ => {
            eprintln!("usage: sandbox-egress-forwarder ADDR SOCKET -- COMMAND...");
            return ExitCode::from(125);
        }
    };
    let listener = match TcpListener::bind(addr) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("egress forwarder: cannot listen on {addr}: {e}");
            return ExitCode::from(125);
        }
    };
    let socket = socket.clone();
    thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let socket = socket.clone();
            thread::spawn(move || relay(conn, &socket));
        }
    });
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
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1);
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn relay(tcp: TcpStream, socket: &str) {
    let Ok(unix) = UnixStream::connect(socket) else {
        return;
    };
    let (Ok(mut tcp_r), Ok(mut unix_w)) = (tcp.try_clone(), unix.try_clone()) else {
        return;
    };
    let up = thread::spawn(move || {
        let _ = io::copy(&mut tcp_r, &mut unix_w);
        let _ = unix_w.shutdown(std::net::Shutdown::Write);
    });
    let (mut unix_r, mut tcp_w) = (unix, tcp);
    let _ = io::copy(&mut unix_r, &mut tcp_w);
    let _ = tcp_w.shutdown(std::net::Shutdown::Write);
    let _ = up.join();
}
