//! `sandbox-egress-forwarder ADDR=SOCKET... -- COMMAND...`: runs inside a sandbox's own
//! network namespace. It listens on each TCP `ADDR` (the sandbox's loopback), relays
//! every connection to its Unix socket `SOCKET` (the provisioner's egress proxy, the LLM
//! relay), and runs COMMAND, exiting with its status. The sandbox has no other way out.
#![forbid(unsafe_code)]

use std::{
    io,
    net::{TcpListener, TcpStream},
    os::unix::{net::UnixStream, process::ExitStatusExt},
    process::{Command, ExitCode},
    thread,
};

const USAGE: &str = "usage: sandbox-egress-forwarder ADDR=SOCKET... -- COMMAND...";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(sep) = args.iter().position(|a| a == "--") else {
        eprintln!("{USAGE}");
        return ExitCode::from(125);
    };
    let (pairs, cmd) = (&args[..sep], &args[sep + 1..]);
    if pairs.is_empty() || cmd.is_empty() {
        eprintln!("{USAGE}");
        return ExitCode::from(125);
    }
    for pair in pairs {
        let Some((addr, socket)) = pair.split_once('=') else {
            eprintln!("{USAGE}");
            return ExitCode::from(125);
        };
        let listener = match TcpListener::bind(addr) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("egress forwarder: cannot listen on {addr}: {e}");
                return ExitCode::from(125);
            }
        };
        let socket = socket.to_owned();
        thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let socket = socket.clone();
                thread::spawn(move || relay(conn, &socket));
            }
        });
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
    let _ = tcp.set_nodelay(true);
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
