//! The console as a person uses it (the browser), and as a client that skips the page
//! (plain HTTP requests), for e2e_console.

use forkyard_tests::{
    png::{self, Image},
    webdriver::{Browser, artifacts_dir},
};
use std::{path::PathBuf, time::Duration};

pub mod actions;
pub mod delivery_form;
pub mod search_form;

/// Markup that would run if a page did not escape it.
pub const XSS: &str = "<script>window.__pwned=1</script><img src=x onerror=window.__pwned=2>";

/// The diff's added-line background (console.css `--add-bg`).
const ADD_BG: [u8; 3] = [0xda, 0xfb, 0xe1];
/// The cost chart's spend line (console.css `--accent`, `.chart .spend`).
pub const CHART_LINE: [u8; 3] = [0x0a, 0x58, 0xca];

pub struct Console {
    pub base: String,
    pub b: Browser,
    shots: PathBuf,
    http: reqwest::Client,
}

impl Console {
    pub async fn start(base: String) -> Self {
        let shots = artifacts_dir("e2e_console");
        eprintln!("console screenshots: {}", shots.display());
        Self {
            base,
            b: Browser::start().await.expect("headless chromium"),
            shots,
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A screenshot kept as `<name>.png`, decoded, and not blank.
    pub async fn shot(&self, name: &str) -> Image {
        let path = self.shots.join(format!("{name}.png"));
        let bytes = self.b.screenshot(&path).await.expect("screenshot");
        let img = png::decode(&bytes).expect("a PNG");
        let v = img.variance(0, 0, img.width, img.height);
        assert!(v > 50.0, "{} looks blank (variance {v:.1})", path.display());
        img
    }

    /// (status, body) of a request with `key`'s cookie (and a fixed CSRF cookie).
    pub async fn raw(&self, path: &str, key: Option<&str>, form: Option<&str>) -> (u16, String) {
        let mut cookie = format!("fy_csrf={}", "a".repeat(64));
        if let Some(k) = key {
            cookie.push_str(&format!("; fy_key={k}"));
        }
        let req = match form {
            Some(body) => self
                .http
                .post(self.url(path))
                .body(body.to_owned())
                .header("content-type", "application/x-www-form-urlencoded"),
            None => self.http.get(self.url(path)),
        };
        let resp = req.header("cookie", cookie).send().await.expect("http");
        let csp = resp.headers().get("content-security-policy").cloned();
        assert!(
            csp.is_some_and(|v| v.to_str().unwrap().contains("script-src 'self'")),
            "{path}: no content security policy"
        );
        (
            resp.status().as_u16(),
            resp.text().await.unwrap_or_default(),
        )
    }

    pub async fn raw_post(&self, path: &str, key: Option<&str>, form: &str) -> (u16, String) {
        self.raw(path, key, Some(form)).await
    }

    /// Without a key: 401 and the sign-in link, no runs.
    pub async fn refused_without_key(&self) {
        let (status, body) = self.raw("/runs", None, None).await;
        assert_eq!(status, 401, "{body}");
        assert!(body.contains("href=\"/login\""), "{body}");
        assert!(!body.contains("id=\"runs\""), "{body}");
        self.b.goto(&self.url("/runs")).await.unwrap();
        assert_eq!(self.b.text_of("h1").await, "Sign in");
        assert!(self.b.find_all("#new-run").await.unwrap().is_empty());
        self.shot("01-refused").await;
    }

    pub async fn sign_in(&self, key: &str) {
        self.b.goto(&self.url("/login")).await.unwrap();
        self.b.fill("#key", "fyk_wrong_key").await.unwrap();
        self.click_to_load("form.login button").await;
        let said = self.b.text_of("#key-error").await;
        assert!(said.contains("invalid"), "a wrong key: {said:?}");
        self.b.fill("#key", key).await.unwrap();
        self.click_to_load("form.login button").await;
        assert!(self.b.url().await.unwrap().ends_with("/runs"));
        assert_eq!(self.b.text_of("h1").await, "Runs");
        let cookie_visible = self.b.execute("return document.cookie").await.unwrap();
        assert_eq!(cookie_visible, "", "cookies must be http-only");
    }

    /// Click something that loads a new page (a form's submit), and wait for that page.
    pub async fn click_to_load(&self, css: &str) {
        self.b
            .execute("window.__oldPage = true; return true")
            .await
            .unwrap();
        self.click(css).await;
        self.b
            .wait_for(
                "return window.__oldPage === undefined && document.readyState === 'complete'",
                Duration::from_secs(30),
            )
            .await
            .unwrap_or_else(|e| panic!("{css} loaded no page: {e}"));
    }

    pub async fn click(&self, css: &str) {
        let el = self
            .b
            .find(css)
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"));
        self.b.click(&el).await.unwrap();
    }

    pub async fn fill_new_run(
        &self,
        src: &std::path::Path,
        prompt: &str,
        budget: &str,
        labels: &str,
    ) {
        let b = &self.b;
        b.fill("#repo", src.to_str().unwrap()).await.unwrap();
        b.fill("#prompt", prompt).await.unwrap();
        b.fill("#forks", "3").await.unwrap();
        self.click("#driver option[value=\"command\"]").await;
        b.fill("#command", super::AGENT).await.unwrap();
        b.fill("#budget", budget).await.unwrap();
        b.fill("#labels", labels).await.unwrap();
    }

    pub async fn submit_new_run(&self) {
        self.click_to_load("#new-run button[type=submit]").await;
    }

    /// The runs page's form filled in as [`Self::fill_new_run`] does, for one fork, with
    /// its optional section `section` (`more`, `deliver`) opened.
    pub async fn fill_one_fork(&self, src: &std::path::Path, prompt: &str, section: &str) {
        self.b.goto(&self.url("/runs")).await.unwrap();
        let loaded = format!(
            "return document.readyState === 'complete' && !!document.getElementById('{section}')"
        );
        self.b
            .wait_for(&loaded, Duration::from_secs(30))
            .await
            .unwrap();
        self.fill_new_run(src, prompt, "1", "").await;
        self.b.fill("#forks", "1").await.unwrap();
        self.click(&format!("#{section} summary")).await;
    }

    /// The run a submitted form launched, from the run page it led to; else the form's
    /// errors are the panic's message.
    pub async fn launched_run_id(&self) -> String {
        let url = self.b.url().await.unwrap();
        match url.rsplit_once("/runs/") {
            Some((_, id)) if id.starts_with("run-") => id.to_owned(),
            _ => {
                let errors = self.b.execute(
                    "return Array.from(document.querySelectorAll('.field-error')).map(e => e.innerText)",
                );
                panic!(
                    "no run page after the launch: {url}; errors: {:?}",
                    errors.await
                )
            }
        }
    }

    /// The page ran nothing from the run's data, and shows it as text.
    pub async fn assert_nothing_ran(&self, page: &str) {
        let v = self
            .b
            .execute(
                "return [window.__pwned === undefined, document.scripts.length, \
                 document.querySelectorAll('img').length, document.body.innerText.includes('<script>window.__pwned')]",
            )
            .await
            .unwrap();
        assert_eq!(
            v,
            serde_json::json!([true, 1, 0, true]),
            "{page}: [nothing ran, scripts, imgs, shown as text]"
        );
    }

    /// The run on the runs page: done, three of three forks, its labels as text.
    pub async fn runs_page_lists(&self, run_id: &str) {
        self.b.goto(&self.url("/runs")).await.unwrap();
        let row = self.b.text_of(&format!("tr[data-run=\"{run_id}\"]")).await;
        assert!(
            row.contains("completed") && row.contains("3 / 3"),
            "runs page row: {row:?}"
        );
        assert!(row.contains(XSS), "label shown as text: {row:?}");
        self.assert_nothing_ran("runs page").await;
        self.b
            .goto(&self.url("/runs?state=cancelled"))
            .await
            .unwrap();
        assert!(
            self.b.text_of("#no-runs").await.starts_with("No runs"),
            "state filter"
        );
        self.b.goto(&self.url("/runs")).await.unwrap();
        self.shot("03-runs").await;
    }

    /// Fork 1's page: its added line in the diff, marked `+`, visibly green; the patch's
    /// own `<script>` shown as text.
    pub async fn fork_page_shows_patch(&self, run_id: &str) {
        self.b
            .goto(&self.url(&format!("/runs/{run_id}/forks/1")))
            .await
            .unwrap();
        let added: Vec<String> = self.texts(".diff .ln.add").await;
        assert!(
            added.contains(&"+console line of fork 1".to_owned()),
            "added lines: {added:?}"
        );
        assert!(
            added
                .iter()
                .any(|l| l == "+<script>window.__pwned=3</script>"),
            "{added:?}"
        );
        self.assert_nothing_ran_in_patch().await;
        self.transcript_shows_the_conversation().await;
        let rect = self.viewport_rect("#patch").await;
        let img = self.shot("05-fork").await;
        assert_green(&img, rect, "fork page's diff");
    }

    /// The agent's stream-json lines as a conversation: its message (with `<script>` and
    /// an `<img onerror>`, shown as text), its tool call and the tool's result.
    async fn transcript_shows_the_conversation(&self) {
        let text = self.b.text_of("#transcript").await;
        for said in [
            "<script>window.__pwned=4</script><img src=x onerror=window.__pwned=5> editing",
            "tool call: Bash",
            "tool said hi",
            "started: driver command",
        ] {
            assert!(text.contains(said), "transcript lacks {said:?}: {text}");
        }
        let v = self
            .b
            .execute("return [document.querySelectorAll('#transcript img').length, document.querySelectorAll('#transcript .tool-call').length]")
            .await
            .unwrap();
        assert_eq!(
            v,
            serde_json::json!([0, 1]),
            "[imgs, tool calls] in the transcript"
        );
    }

    async fn assert_nothing_ran_in_patch(&self) {
        let v = self
            .b
            .execute("return [window.__pwned === undefined, document.scripts.length]")
            .await
            .unwrap();
        assert_eq!(v, serde_json::json!([true, 1]), "the patch's script ran");
    }

    /// Fork 1 and fork 2 side by side: same top, left before right, each its own line.
    pub async fn compare_side_by_side(&self, run_id: &str) {
        self.b
            .goto(&self.url(&format!("/runs/{run_id}/forks/1?compare=2")))
            .await
            .unwrap();
        let left = self.viewport_rect("#left").await;
        let right = self.viewport_rect("#right").await;
        assert!(
            (left.1 - right.1).abs() < 2.0 && left.0 + left.2 <= right.0 + 1.0,
            "{left:?} {right:?}"
        );
        assert!(
            self.b
                .text_of("#left")
                .await
                .contains("+console line of fork 1")
        );
        assert!(
            self.b
                .text_of("#right")
                .await
                .contains("+console line of fork 2")
        );
        self.assert_nothing_ran_in_patch().await;
        let img = self.shot("06-compare").await;
        assert_green(&img, left, "left diff");
        assert_green(&img, right, "right diff");
    }

    /// Another tenant's run, an unknown run and an unknown fork: 404 pages.
    pub async fn hidden_and_unknown_are_404(&self, other_key: &str, run_id: &str) {
        for path in [
            format!("/runs/{run_id}"),
            format!("/runs/{run_id}/forks/1"),
            format!("/runs/{run_id}/events"),
        ] {
            let (status, body) = self.raw(&path, Some(other_key), None).await;
            assert_eq!(status, 404, "another tenant's {path}: {body}");
        }
        let (status, _) = self
            .raw_post(
                &format!("/runs/{run_id}/cancel"),
                Some(other_key),
                &format!("csrf={}", "a".repeat(64)),
            )
            .await;
        assert_eq!(status, 404, "another tenant's cancel");
        for action in [
            "pause",
            "resume",
            "budget",
            "forks/1/cancel",
            "forks/1/branch",
        ] {
            let (status, body) = self
                .raw_post(
                    &format!("/runs/{run_id}/{action}"),
                    Some(other_key),
                    &format!("csrf={}&amount=1&count=1", "a".repeat(64)),
                )
                .await;
            assert_eq!(status, 404, "another tenant's {action}: {body}");
        }
        for path in [
            "/runs/run-nope".to_owned(),
            format!("/runs/{run_id}/forks/9"),
            format!("/runs/{run_id}/forks/x"),
        ] {
            self.b.goto(&self.url(&path)).await.unwrap();
            assert_eq!(self.b.text_of("h1").await, "Not found", "{path}");
        }
        self.shot("07-not-found").await;
    }

    async fn texts(&self, css: &str) -> Vec<String> {
        let mut out = Vec::new();
        for el in self.b.find_all(css).await.unwrap() {
            out.push(self.b.text(&el).await.unwrap());
        }
        out
    }

    /// The element's box in the viewport, in screenshot pixels, scrolled into view.
    pub async fn viewport_rect(&self, css: &str) -> (f64, f64, f64, f64) {
        let script = format!(
            "const e = document.querySelector('{css}'); e.scrollIntoView({{block: 'start'}}); \
             const r = e.getBoundingClientRect(), d = window.devicePixelRatio; \
             return [r.x * d, r.y * d, r.width * d, Math.min(r.height, window.innerHeight - r.y) * d]"
        );
        let v: Vec<f64> = serde_json::from_value(self.b.execute(&script).await.unwrap()).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        (v[0], v[1], v[2], v[3])
    }
}

/// The area shows text (variance) and added lines' green.
fn assert_green(img: &Image, rect: (f64, f64, f64, f64), what: &str) {
    assert_colour(img, rect, ADD_BG, what);
}

/// The area is not blank and holds at least 500 pixels of `colour`.
pub fn assert_colour(img: &Image, (x, y, w, h): (f64, f64, f64, f64), colour: [u8; 3], what: &str) {
    let (x, y, w, h) = (x as usize, y.max(0.0) as usize, w as usize, h as usize);
    let green = img
        .region(x, y, w, h)
        .filter(|p| p.iter().zip(colour).all(|(a, b)| a.abs_diff(b) <= 8))
        .count();
    assert!(
        green > 500,
        "{what}: {green} pixels of {colour:02x?} in {x},{y} {w}×{h}"
    );
    let v = img.variance(x, y, w, h);
    assert!(v > 50.0, "{what}: blank area (variance {v:.1})");
}
