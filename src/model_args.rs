//! `serve --provider openai|anthropic --model M [--base-url URL] [--api-key-env VAR]
//! [--model-tools LIST] [--system TEXT] [--no-stream] [--name-sessions-with-model]` (issue
//! 35): a real model instead of the scripted provider; `--context-budget TOKENS` bounds what
//! a request carries of its conversation; `--http-allow HOSTS` adds the `http` tool. The key is read from the environment variable named, at startup,
//! and is never written to the store, a log line or `/debug`.

use std::sync::Arc;

use openprogram_actors::agent::{Provider, Tool, ToolRegistry};
use openprogram_actors::http_tool::HttpTool;
use openprogram_actors::providers::{Api, ApiKey, HttpProvider, ProviderConfig};

use crate::{Error, Result};

#[derive(Debug, Clone, Default, clap::Args)]
pub struct ModelArgs {
    /// Use a real model: `openai` (any OpenAI-compatible chat-completions server) or
    /// `anthropic`. Default: the built-in scripted provider.
    #[arg(long, requires = "model")]
    pub provider: Option<String>,
    /// The model name the provider is asked for.
    #[arg(long, requires = "provider")]
    pub model: Option<String>,
    /// The API's base URL (default: the provider's public endpoint), such as
    /// http://127.0.0.1:8080/v1 for a local server.
    #[arg(long, requires = "provider")]
    pub base_url: Option<String>,
    /// The environment variable holding the API key (none is sent without it).
    #[arg(long, requires = "provider")]
    pub api_key_env: Option<String>,
    /// The tools offered to the model, by name, separated by commas (default: none). The
    /// model's call to any other tool fails its execution.
    #[arg(long, requires = "provider", value_delimiter = ',')]
    pub model_tools: Vec<String>,
    /// A system prompt sent with every request.
    #[arg(long, requires = "provider")]
    pub system: Option<String>,
    /// Ask for whole responses instead of streamed ones.
    #[arg(long, requires = "provider")]
    pub no_stream: bool,
    /// The tokens a model request may hold, estimated before it is made. Past it, the
    /// earlier turns of the conversation are summarized (by excerpts); still past it, the
    /// oldest are left out whole and the request says so. Default: no limit.
    #[arg(long, value_name = "TOKENS")]
    pub context_budget: Option<u64>,
    /// Name each session by asking the model for a short title after its first turn
    /// (default: the first words of its first message, which also stand when the model
    /// fails).
    #[arg(long, requires = "provider")]
    pub name_sessions_with_model: bool,
    /// Add the `http` tool, allowed to reach exactly these hosts (`host`, `host:port` or
    /// `*.domain`, separated by commas). Without it there is no `http` tool.
    #[arg(long, value_delimiter = ',')]
    pub http_allow: Vec<String>,
}

impl ModelArgs {
    /// The tools these arguments add to the built-in ones. Usage errors are
    /// `InvalidRequest` (exit 2).
    pub fn tools(&self) -> Result<Vec<Arc<dyn Tool>>> {
        if self.http_allow.is_empty() {
            return Ok(Vec::new());
        }
        let http = HttpTool::new(&self.http_allow)
            .map_err(|error| Error::InvalidRequest(format!("--http-allow: {error}")))?;
        Ok(vec![Arc::new(http)])
    }

    /// The provider these arguments ask for, offering tools of `tools`; `None` for the
    /// scripted provider. Usage errors are `InvalidRequest` (exit 2).
    pub fn provider(&self, tools: &ToolRegistry) -> Result<Option<Arc<dyn Provider>>> {
        let Some(name) = &self.provider else {
            return Ok(None);
        };
        let api = Api::parse(name).ok_or_else(|| {
            Error::InvalidRequest(format!("unknown provider `{name}`: openai or anthropic"))
        })?;
        let model = self.model.clone().unwrap_or_default();
        let mut config = ProviderConfig::new(api, model).stream(!self.no_stream);
        if let Some(url) = &self.base_url {
            config = config.base_url(url.clone());
        }
        if let Some(var) = &self.api_key_env {
            config = config.api_key(ApiKey::from_env(var).map_err(Error::InvalidRequest)?);
        }
        if let Some(system) = &self.system {
            config = config.system(system.clone());
        }
        for name in &self.model_tools {
            let spec = tools.spec(name).ok_or_else(|| {
                Error::InvalidRequest(format!("--model-tools: no tool is called `{name}`"))
            })?;
            config = config.tool(spec);
        }
        let provider = HttpProvider::new(config).map_err(Error::Unavailable)?;
        Ok(Some(Arc::new(provider)))
    }
}
