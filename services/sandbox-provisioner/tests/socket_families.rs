//! The socket families a sandboxed command can open: the network namespace confines
//! `AF_INET`, `AF_INET6` and `AF_UNIX`'s abstract names, but not `AF_VSOCK` (the
//! hypervisor and the VMs on its transport) nor the kernel's other families. On a VM
//! with a vsock transport (`/dev/vsock` on the host) the probe's vsock listener is what
//! an agent would reach the host through; elsewhere the refusal is checked all the same.

mod common;

use common::fixture;
use std::collections::HashMap;

/// Prints `name errno` per attempt (0: it worked).
const SOCKET_PROBE: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <linux/netlink.h>
#include <linux/vm_sockets.h>
#include <linux/io_uring.h>
static void report(const char *name, int ok) { printf("%s %d\n", name, ok ? 0 : errno); }
static void try_socket(const char *name, int family, int type, int protocol) {
  errno = 0; int fd = socket(family, type, protocol); report(name, fd >= 0); if (fd >= 0) close(fd);
}
int main(void) {
  errno = 0;
  int v = socket(AF_VSOCK, SOCK_STREAM, 0);
  report("vsock", v >= 0);
  if (v >= 0) {
    struct sockaddr_vm a; memset(&a, 0, sizeof a);
    a.svm_family = AF_VSOCK; a.svm_cid = VMADDR_CID_ANY; a.svm_port = VMADDR_PORT_ANY;
    errno = 0; report("vsock_listen", bind(v, (struct sockaddr *)&a, sizeof a) == 0 && listen(v, 1) == 0);
  }
  int pair[2];
  errno = 0; report("vsock_pair", socketpair(AF_VSOCK, SOCK_STREAM, 0, pair) == 0);
  try_socket("packet", AF_PACKET, SOCK_DGRAM, 0);
  try_socket("alg", AF_ALG, SOCK_SEQPACKET, 0);
  try_socket("key", AF_KEY, SOCK_RAW, 2);
  try_socket("bluetooth", AF_BLUETOOTH, SOCK_STREAM, 0);
  try_socket("xdp", AF_XDP, SOCK_RAW, 0);
  try_socket("netlink_netfilter", AF_NETLINK, SOCK_RAW, NETLINK_NETFILTER);
  try_socket("netlink_uevent", AF_NETLINK, SOCK_RAW, NETLINK_KOBJECT_UEVENT);
  struct io_uring_params p; memset(&p, 0, sizeof p);
  errno = 0; long ring = syscall(SYS_io_uring_setup, 4, &p); report("io_uring", ring >= 0);
  /* What every tool needs: these must still work. */
  errno = 0; report("unix_pair", socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0);
  int t = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in in; memset(&in, 0, sizeof in);
  in.sin_family = AF_INET; in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  errno = 0; report("inet_listen", t >= 0 && bind(t, (struct sockaddr *)&in, sizeof in) == 0 && listen(t, 1) == 0);
  try_socket("inet6", AF_INET6, SOCK_DGRAM, 0);
  try_socket("netlink_route", AF_NETLINK, SOCK_RAW, NETLINK_ROUTE);
  struct ifaddrs *ifs = 0;
  errno = 0; int got = getifaddrs(&ifs);
  int lo = 0;
  for (struct ifaddrs *i = ifs; got == 0 && i; i = i->ifa_next) lo |= strcmp(i->ifa_name, "lo") == 0;
  report("getifaddrs_lo", got == 0 && lo);
  return 0;
}
"#;

#[tokio::test]
async fn a_sandbox_opens_only_the_socket_families_it_needs() {
    let f = fixture().await;
    let sbx = f.create().await;
    f.core
        .write_file(forkyard_proto::sandbox::v1::WriteFileRequest {
            sandbox_id: sbx.id.clone(),
            path: "probe.c".into(),
            content: SOCKET_PROBE.as_bytes().to_vec(),
            mode: 0o644,
        })
        .await
        .unwrap();
    let out = f.sh(&sbx.id, "gcc -O0 -o probe probe.c && ./probe").await;
    assert_eq!(out.exit_code, 0, "{}{}", out.stdout, out.stderr);
    let results: HashMap<&str, i32> = out
        .stdout
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(n, e)| (n, e.parse().unwrap()))
        .collect();
    let errno = |name: &str| {
        *results
            .get(name)
            .unwrap_or_else(|| panic!("{name}: {out:?}"))
    };
    // The vsock socket is never made, so neither is its listener.
    assert_eq!(errno("vsock"), libc::EAFNOSUPPORT, "{}", out.stdout);
    assert!(!results.contains_key("vsock_listen"), "{}", out.stdout);
    for name in ["vsock_pair", "packet", "alg", "key", "bluetooth", "xdp"] {
        assert_eq!(errno(name), libc::EAFNOSUPPORT, "{name}: {}", out.stdout);
    }
    for name in ["netlink_netfilter", "netlink_uevent"] {
        assert_eq!(errno(name), libc::EPROTONOSUPPORT, "{name}: {}", out.stdout);
    }
    assert_eq!(errno("io_uring"), libc::EPERM, "{}", out.stdout);
    for name in [
        "unix_pair",
        "inet_listen",
        "inet6",
        "netlink_route",
        "getifaddrs_lo",
    ] {
        assert_eq!(errno(name), 0, "{name}: {}", out.stdout);
    }

    // Real tools' networking on the sandbox's loopback, and their view of its interfaces.
    let script = "python3 -c 'import socket; s = socket.create_server((\"127.0.0.1\", 0)); c = socket.create_connection(s.getsockname()); a, _ = s.accept(); c.sendall(b\"py\"); print(a.recv(2).decode())' && node -e 'console.log(Object.keys(require(\"os\").networkInterfaces()).includes(\"lo\") ? \"node\" : \"no lo\")'";
    let out = f.sh(&sbx.id, script).await;
    assert_eq!(out.exit_code, 0, "{}{}", out.stdout, out.stderr);
    assert_eq!(out.stdout, "py\nnode\n", "{}", out.stderr);
}
