//! How to reach a model: the API, the endpoint, the key and the tools offered.

use std::sync::Arc;
use std::time::Duration;

use super::transport::RetryPolicy;
use crate::agent::ToolSpec;

/// Which wire protocol a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `POST {base_url}/chat/completions` with a bearer token.
    OpenAi,
    /// `POST {base_url}/v1/messages` with `x-api-key` and `anthropic-version`.
    Anthropic,
}

impl Api {
    /// `openai` or `anthropic`, as `serve --provider` takes it.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::OpenAi, Self::Anthropic]
            .into_iter()
            .find(|api| api.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::OpenAi => "openai",
            Self::Anthropic => "anthropic",
        }
    }

    /// The public endpoint's base URL.
    pub fn default_base_url(self) -> &'static str {
        match self {
            Self::OpenAi => "https://api.openai.com/v1",
            Self::Anthropic => "https://api.anthropic.com",
        }
    }
}

/// An API key. Its `Debug` never shows it, and nothing in the runtime writes it anywhere.
#[derive(Clone)]
pub struct ApiKey(Arc<str>);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(hidden)")
    }
}

impl ApiKey {
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into().into())
    }

    /// The key in the environment variable `var`: an error naming the variable (never a
    /// value) if it is unset, empty or not UTF-8.
    pub fn from_env(var: &str) -> Result<Self, String> {
        match std::env::var(var) {
            Ok(key) if !key.trim().is_empty() => Ok(Self::new(key.trim())),
            Ok(_) => Err(format!("the environment variable {var} is empty")),
            Err(std::env::VarError::NotPresent) => {
                Err(format!("the environment variable {var} is not set"))
            }
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(format!("the environment variable {var} is not UTF-8"))
            }
        }
    }

    pub(super) fn expose(&self) -> &str {
        &self.0
    }
}

/// How to reach a model. `ProviderConfig::new(api, model)` has the defaults.
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    pub api: Api,
    pub model: String,
    /// Without a trailing `/`; the API's public endpoint by default.
    pub base_url: String,
    /// `None` for a local server that wants none.
    pub api_key: Option<ApiKey>,
    /// A system prompt sent with every request.
    pub system: Option<String>,
    /// The response's token limit. Anthropic requires one (4,096 unless set); OpenAI-compatible
    /// requests carry it only when set.
    pub max_tokens: Option<u32>,
    /// Ask for a streamed response (SSE). Either way a decision is made only from a whole
    /// response.
    pub stream: bool,
    /// The tools offered to the model. A call to any other tool is refused as a model error.
    pub tools: Vec<ToolSpec>,
    pub retry: RetryPolicy,
    /// Connecting to the endpoint.
    pub connect_timeout: Duration,
    /// The longest silence while waiting for or reading a response.
    pub read_timeout: Duration,
}

impl ProviderConfig {
    pub fn new(api: Api, model: impl Into<String>) -> Self {
        Self {
            api,
            model: model.into(),
            base_url: api.default_base_url().to_owned(),
            api_key: None,
            system: None,
            max_tokens: None,
            stream: true,
            tools: Vec::new(),
            retry: RetryPolicy::default(),
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(120),
        }
    }

    pub fn base_url(mut self, url: impl Into<String>) -> Self {
        self.base_url = url.into().trim_end_matches('/').to_owned();
        self
    }

    pub fn api_key(mut self, key: ApiKey) -> Self {
        self.api_key = Some(key);
        self
    }

    pub fn system(mut self, system: impl Into<String>) -> Self {
        self.system = Some(system.into());
        self
    }

    pub fn stream(mut self, stream: bool) -> Self {
        self.stream = stream;
        self
    }

    /// Offers a tool to the model.
    pub fn tool(mut self, spec: ToolSpec) -> Self {
        self.tools.push(spec);
        self
    }

    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }
}
