//! A real browser for the console's tests: Debian's headless Chromium driven by its
//! chromedriver over the W3C WebDriver protocol (JSON over HTTP), spoken directly.

use serde_json::{Value, json};
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// The W3C key of an element reference in WebDriver's answers.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

pub struct Browser {
    http: reqwest::Client,
    /// `http://127.0.0.1:<port>/session/<id>`.
    session: String,
    driver: Child,
}

/// An element on the current page.
#[derive(Debug, Clone)]
pub struct Element(String);

impl Browser {
    /// Start chromedriver and a headless Chromium with a 1280×1000 window.
    pub async fn start() -> anyhow::Result<Self> {
        let port = crate::mesh::free_port();
        let driver = Command::new(std::env::var("CHROMEDRIVER").unwrap_or("chromedriver".into()))
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                anyhow::anyhow!("cannot start chromedriver (Debian chromium-driver): {e}")
            })?;
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": std::env::var("CHROMIUM").unwrap_or("/usr/bin/chromium".into()),
                // --no-sandbox: the tests run as root, where Chromium's sandbox will not start.
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,1000"]
            }
        }}});
        let deadline = Instant::now() + Duration::from_secs(20);
        let created = loop {
            match http
                .post(format!("{base}/session"))
                .json(&caps)
                .send()
                .await
            {
                Ok(r) => break r.json::<Value>().await?,
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(e) => anyhow::bail!("chromedriver did not answer: {e}"),
            }
        };
        let id = created["value"]["sessionId"]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("no session: {created}"))?;
        Ok(Self {
            session: format!("{base}/session/{id}"),
            http,
            driver,
        })
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let mut req = self.http.request(method, format!("{}{path}", self.session));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp: Value = req.send().await?.json().await?;
        if let Some(err) = resp["value"].get("error") {
            anyhow::bail!("webdriver {path}: {err}: {}", resp["value"]["message"]);
        }
        Ok(resp["value"].clone())
    }

    async fn post(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.call(reqwest::Method::GET, path, None).await
    }

    pub async fn goto(&self, url: &str) -> anyhow::Result<()> {
        self.post("/url", json!({ "url": url })).await.map(drop)
    }

    pub async fn url(&self) -> anyhow::Result<String> {
        Ok(self
            .get("/url")
            .await?
            .as_str()
            .unwrap_or_default()
            .to_owned())
    }

    pub async fn find(&self, css: &str) -> anyhow::Result<Element> {
        let v = self
            .post("/element", json!({"using": "css selector", "value": css}))
            .await?;
        let id = v[ELEMENT]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("{css}: no element in {v}"))?;
        Ok(Element(id.to_owned()))
    }

    pub async fn find_all(&self, css: &str) -> anyhow::Result<Vec<Element>> {
        let v = self
            .post("/elements", json!({"using": "css selector", "value": css}))
            .await?;
        Ok(v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e[ELEMENT].as_str().map(|s| Element(s.to_owned())))
            .collect())
    }

    pub async fn text(&self, el: &Element) -> anyhow::Result<String> {
        Ok(self
            .get(&format!("/element/{}/text", el.0))
            .await?
            .as_str()
            .unwrap_or_default()
            .to_owned())
    }

    /// The visible text of the first element matching `css` ("" when there is none).
    pub async fn text_of(&self, css: &str) -> String {
        match self.find(css).await {
            Ok(el) => self.text(&el).await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    pub async fn click(&self, el: &Element) -> anyhow::Result<()> {
        self.post(&format!("/element/{}/click", el.0), json!({}))
            .await
            .map(drop)
    }

    /// Replace the field's value with `text`.
    pub async fn fill(&self, css: &str, text: &str) -> anyhow::Result<()> {
        let el = self.find(css).await?;
        self.post(&format!("/element/{}/clear", el.0), json!({}))
            .await?;
        self.post(&format!("/element/{}/value", el.0), json!({ "text": text }))
            .await
            .map(drop)
    }

    /// The element's position and size in CSS pixels: (x, y, width, height).
    pub async fn rect(&self, el: &Element) -> anyhow::Result<(f64, f64, f64, f64)> {
        let v = self.get(&format!("/element/{}/rect", el.0)).await?;
        let n = |k: &str| v[k].as_f64().unwrap_or_default();
        Ok((n("x"), n("y"), n("width"), n("height")))
    }

    /// Resize the browser's window (CSS pixels; headless: the viewport follows).
    pub async fn window_size(&self, width: u32, height: u32) -> anyhow::Result<()> {
        self.post("/window/rect", json!({ "width": width, "height": height }))
            .await
            .map(drop)
    }

    /// Run `script` (a function body) in the page; what it returns.
    pub async fn execute(&self, script: &str) -> anyhow::Result<Value> {
        self.post("/execute/sync", json!({ "script": script, "args": [] }))
            .await
    }

    /// A PNG of the viewport, also written to `path`.
    pub async fn screenshot(&self, path: &Path) -> anyhow::Result<Vec<u8>> {
        use base64::Engine as _;
        let b64 = self.get("/screenshot").await?;
        let png =
            base64::engine::general_purpose::STANDARD.decode(b64.as_str().unwrap_or_default())?;
        std::fs::write(path, &png)?;
        Ok(png)
    }

    /// Wait up to `timeout` for `script` to return true.
    pub async fn wait_for(&self, script: &str, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.execute(script).await? == Value::Bool(true) {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "not true in {timeout:?}: {script}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // chromedriver ends its Chromium with the session; the driver itself is ours.
        let _ = std::process::Command::new("curl")
            .args(["-s", "-X", "DELETE", &self.session])
            .stdout(Stdio::null())
            .status();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Where a test keeps its screenshots: `FORKYARD_TEST_ARTIFACTS`, else the target dir's
/// `test-artifacts/<name>`; made empty.
pub fn artifacts_dir(name: &str) -> PathBuf {
    let root = std::env::var_os("FORKYARD_TEST_ARTIFACTS").map_or_else(
        || crate::mesh::bin_dir().join("test-artifacts"),
        PathBuf::from,
    );
    let dir = root.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("artifacts dir");
    dir
}
