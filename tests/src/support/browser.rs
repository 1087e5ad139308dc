//! A real Chromium, headless, driven over WebDriver (`chromedriver`, which
//! the test starts on a free loopback port) from inside `cargo test`.
//! Waits are conditions polled with a timeout; on a timeout the page is
//! saved as a screenshot next to the others and the test fails with what
//! it waited for.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use baton_testkit::free_port;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

/// Longest wait for anything a page should show.
pub const PATIENCE: Duration = Duration::from_secs(20);

pub struct Browser {
    pub client: Client,
    driver: Child,
    /// Where screenshots go: under the build's temporary directory, per
    /// test, never committed.
    pub shots: PathBuf,
}

fn which(names: &[&str]) -> String {
    for name in names {
        if let Ok(out) = Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {name}"))
            .output()
            && out.status.success()
        {
            return String::from_utf8_lossy(&out.stdout).trim().to_owned();
        }
    }
    panic!(
        "none of {names:?} is installed: the browser tests need Chromium and chromedriver \
         (scripts/setup-test-deps installs Debian's chromium and chromium-driver)"
    );
}

impl Browser {
    pub async fn start(shots: PathBuf) -> Self {
        std::fs::create_dir_all(&shots).expect("screenshot directory");
        let chromium = which(&["chromium", "chromium-browser", "google-chrome"]);
        let port = free_port();
        let driver = Command::new(which(&["chromedriver"]))
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--window-size=1400,1000",
                ],
            }),
        );
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + PATIENCE;
        let client = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(client) => break client,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("no WebDriver session at {url}: {e}"),
            }
        };
        Self {
            client,
            driver,
            shots,
        }
    }

    pub async fn goto(&self, url: &str) {
        self.client
            .goto(url)
            .await
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    }

    /// Saves the page as `<name>.png`.
    pub async fn screenshot(&self, name: &str) {
        if let Ok(png) = self.client.screenshot().await {
            let _ = std::fs::write(self.shots.join(format!("{name}.png")), png);
        }
    }

    /// The text of the first element matching `css`, if any.
    pub async fn text(&self, css: &str) -> Option<String> {
        let element = self.client.find(Locator::Css(css)).await.ok()?;
        element.text().await.ok()
    }

    pub async fn exists(&self, css: &str) -> bool {
        self.client.find(Locator::Css(css)).await.is_ok()
    }

    /// Waits until the text of `css` satisfies `ok`; returns it.
    pub async fn wait_text(&self, css: &str, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let text = self.text(css).await;
            if let Some(text) = &text
                && ok(text)
            {
                return text.clone();
            }
            if Instant::now() > deadline {
                let name = format!(
                    "timeout-{}",
                    what.replace(|c: char| !c.is_alphanumeric(), "-")
                );
                self.screenshot(&name).await;
                panic!(
                    "waited {PATIENCE:?} for {what} ({css}); last text: {text:?}; page: {}",
                    self.shots.join(format!("{name}.png")).display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until an element matches `css`.
    pub async fn wait_for(&self, css: &str, what: &str) {
        self.wait_text(css, what, |_| true).await;
    }

    pub async fn click(&self, css: &str) {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css} to click: {e}"))
            .click()
            .await
            .unwrap_or_else(|e| panic!("clicking {css}: {e}"));
    }

    pub async fn fill(&self, css: &str, text: &str) {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css} to fill: {e}"))
            .send_keys(text)
            .await
            .unwrap_or_else(|e| panic!("typing into {css}: {e}"));
    }

    /// Runs `script` in the page and returns its value.
    pub async fn eval(&self, script: &str) -> Value {
        self.client
            .execute(script, Vec::new())
            .await
            .unwrap_or_else(|e| panic!("script failed: {e}"))
    }

    /// `fetch` from the page (its cookies, its origin): the HTTP status.
    pub async fn fetch_status(&self, method: &str, path: &str, form: &str) -> u64 {
        let script = format!(
            "const done = arguments[0];\
             fetch({path:?}, {{method: {method:?}, headers: {{'content-type': 'application/x-www-form-urlencoded'}}, body: {form:?}, redirect: 'manual'}})\
               .then(r => done(r.status), e => done(-1));"
        );
        self.client
            .execute_async(&script, Vec::new())
            .await
            .unwrap_or_else(|e| panic!("fetch failed: {e}"))
            .as_u64()
            .unwrap_or(0)
    }

    pub async fn close(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
    }
}
