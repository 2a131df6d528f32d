//! A real OCI registry for tests: Debian's `docker-registry` (the CNCF distribution
//! registry) on a free loopback port, pushed to with `skopeo`.

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// `docker-registry serve` on a free loopback port, storing in a temp dir, its log in
/// `<dir>/registry.log`.
pub struct Registry {
    child: Child,
    pub addr: String,
    pub log: PathBuf,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn start_registry(dir: &Path) -> Registry {
    start_registry_with(dir, None)
}

/// With `htpasswd`: every request needs basic auth by a user of that (bcrypt) file.
pub fn start_registry_with(dir: &Path, htpasswd: Option<&Path>) -> Registry {
    let addr = format!("127.0.0.1:{}", free_port());
    let config = dir.join("registry.yml");
    let auth = htpasswd.map_or_else(String::new, |file| {
        format!(
            "auth:\n  htpasswd:\n    realm: forkyard-test\n    path: {}\n",
            file.display()
        )
    });
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n{auth}",
            dir.join("data").display()
        ),
    )
    .unwrap();
    let log = dir.join("registry.log");
    let child = Command::new("docker-registry")
        .args(["serve", config.to_str().unwrap()])
        .stdout(Stdio::from(std::fs::File::create(&log).unwrap()))
        .stderr(Stdio::from(
            std::fs::File::options().append(true).open(&log).unwrap(),
        ))
        .spawn()
        .expect("docker-registry (Debian package docker-registry; make deps installs it)");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(
            Instant::now() < deadline,
            "the registry did not start: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Registry { child, addr, log }
}

/// Push the `docker save` archive `archive` as `<registry>/<name>`; its manifest digest.
pub fn push(registry: &Registry, archive: &Path, name: &str) -> String {
    push_as(registry, archive, name, None)
}

/// Push with `user:password` credentials.
pub fn push_as(registry: &Registry, archive: &Path, name: &str, creds: Option<&str>) -> String {
    let dest = format!("docker://{}/{name}", registry.addr);
    let creds_args: Vec<String> = creds
        .map(|c| vec![format!("--dest-creds={c}")])
        .unwrap_or_default();
    let out = Command::new("skopeo")
        .args(["copy", "--quiet", "--dest-tls-verify=false"])
        .args(&creds_args)
        .arg(format!("docker-archive:{}", archive.display()))
        .arg(&dest)
        .output()
        .expect("skopeo (Debian package skopeo; make deps installs it)");
    assert!(
        out.status.success(),
        "skopeo copy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let inspect_creds: Vec<String> = creds
        .map(|c| vec![format!("--creds={c}")])
        .unwrap_or_default();
    let out = Command::new("skopeo")
        .args(["inspect", "--tls-verify=false", "--format", "{{.Digest}}"])
        .args(&inspect_creds)
        .arg(&dest)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "skopeo inspect: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}
