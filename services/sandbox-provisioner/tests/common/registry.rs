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

/// One layer as stored in the registry (gzip or plain tar bytes) and the `diff_id` its
/// image's config gives it.
pub struct RawLayer {
    pub stored: Vec<u8>,
    pub diff_id: String,
}

impl RawLayer {
    /// A plain tar, its `diff_id` its own digest.
    pub fn tar(bytes: Vec<u8>) -> Self {
        Self {
            diff_id: digest(&bytes),
            stored: bytes,
        }
    }
}

/// `sha256:<hex>` of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    format!("sha256:{:x}", sha2::Sha256::digest(bytes))
}

/// Push an OCI image of `layers` as `<registry>/<name>:<tag>` through the distribution
/// API itself (skopeo would recompress what a hostile test needs byte for byte): blob
/// uploads, then the manifest. Its manifest digest.
pub async fn push_raw(registry: &Registry, name: &str, tag: &str, layers: &[RawLayer]) -> String {
    let http = reqwest::Client::new();
    let base = format!("http://{}", registry.addr);
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>()},
    })
    .to_string()
    .into_bytes();
    let mut descs = Vec::new();
    for l in layers {
        upload(&http, &base, name, &l.stored).await;
        let gz = l.stored.starts_with(&[0x1f, 0x8b]);
        descs.push(serde_json::json!({
            "mediaType": if gz { "application/vnd.oci.image.layer.v1.tar+gzip" } else { "application/vnd.oci.image.layer.v1.tar" },
            "digest": digest(&l.stored), "size": l.stored.len(),
        }));
    }
    upload(&http, &base, name, &config).await;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(&config), "size": config.len()},
        "layers": descs,
    })
    .to_string();
    let resp = http
        .put(format!("{base}/v2/{name}/manifests/{tag}"))
        .header("content-type", "application/vnd.oci.image.manifest.v1+json")
        .body(manifest.clone())
        .send()
        .await
        .unwrap();
    assert!(
        resp.status().is_success(),
        "put manifest: {}",
        resp.text().await.unwrap()
    );
    digest(manifest.as_bytes())
}

async fn upload(http: &reqwest::Client, base: &str, name: &str, bytes: &[u8]) {
    let resp = http
        .post(format!("{base}/v2/{name}/blobs/uploads/"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202, "start an upload");
    let location = resp.headers()["location"].to_str().unwrap().to_owned();
    let location = if location.starts_with("http") {
        location
    } else {
        format!("{base}{location}")
    };
    let sep = if location.contains('?') { '&' } else { '?' };
    let resp = http
        .put(format!("{location}{sep}digest={}", digest(bytes)))
        .header("content-type", "application/octet-stream")
        .body(bytes.to_vec())
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "put blob: {}", resp.status());
}
