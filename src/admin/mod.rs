//! Admin commands over the REST API (docs/design.md §5): `pullman agents …`, `pullman work-orders …`,
//! `pullman log …`. One concern per file: [`args`] the flags, [`render`] the output formats,
//! [`agents`], [`orders`] and [`log`] the commands, [`history`] the attempts, [`lookup`] names and id prefixes, [`wait`]
//! waiting and watching, [`wait_note`] why an order waits, said while waiting.

pub mod agents;
pub mod args;
pub mod explain;
pub mod history;
pub mod log;
pub mod logs;
pub mod lookup;
pub mod order_list;
pub mod orders;
pub mod render;
pub mod wait;
pub mod wait_note;

use std::future::Future;
use std::path::PathBuf;

use anyhow::Context;

pub use agents::agents;
pub use args::{AgentsCommand, Connection, LogCommand, Output, WorkOrdersCommand};
pub use log::log;
pub use orders::work_orders;

use crate::client::{Client, ClientError, read_token_file};
use crate::queue::limits::PAGE_LIMIT;
use crate::wire::Page;

impl Connection {
    /// A client with the admin token: `--token`, else `--token-file`, else the file `serve`
    /// generates under the data dir.
    pub fn client(&self) -> anyhow::Result<Client> {
        let token = match (&self.token, &self.token_file) {
            (Some(t), _) => t.clone(),
            (None, Some(f)) => read_token_file(f)?,
            (None, None) => {
                let dir = std::env::var_os("PULLMAN_DATA_DIR")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| PathBuf::from("./.pullman"));
                let path = dir.join("admin-token");
                read_token_file(&path).with_context(|| {
                    "no admin token: pass --token-file or set PULLMAN_ADMIN_TOKEN (the server \
                     writes a generated one to <data-dir>/admin-token)"
                })?
            }
        };
        Ok(Client::new(&self.server, &token)?)
    }
}

/// A refusal of the server (4xx) reworded in the user's terms: the API's field names in its
/// message (`targeting.agent_ids`, `yaml_content`) become the flags that set them (`--agent-id`,
/// `-f FILE`), as `fields` maps them; other errors are returned as they are.
pub fn in_flag_words(error: ClientError, fields: &[(&str, &str)]) -> anyhow::Error {
    match error {
        ClientError::Api {
            status,
            code,
            message,
            retry_after,
        } if status.is_client_error() => {
            let message = rename_fields(&message, fields);
            ClientError::Api {
                status,
                code,
                message,
                retry_after,
            }
            .into()
        }
        other => other.into(),
    }
}

/// Replaces whole-word occurrences of each field name (a word: letters, digits, `_` and `.`).
fn rename_fields(message: &str, fields: &[(&str, &str)]) -> String {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.';
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(start) = rest.find(|c: char| word(c)) {
        out.push_str(&rest[..start]);
        let tail = &rest[start..];
        let end = tail.find(|c: char| !word(c)).unwrap_or(tail.len());
        let token = &tail[..end];
        // A sentence's full stop is not part of the field name.
        let bare = token.trim_end_matches('.');
        match fields.iter().find(|(f, _)| *f == bare) {
            Some((_, flag)) => {
                out.push_str(flag);
                out.push_str(&token[bare.len()..]);
            }
            None => out.push_str(token),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// Largest page the API serves, in items: [`PAGE_LIMIT`]`.max` as a count (docs/design.md §5).
pub const MAX_PAGE: usize = PAGE_LIMIT.max as usize;

/// Fetches pages of at most `chunk` items through `fetch(page_size, cursor)` following
/// `next_cursor`, until `limit` items (or, with `all`, the last page). Returns the items and
/// whether more were left behind.
pub async fn collect_pages<T, F, Fut>(
    limit: usize,
    all: bool,
    chunk: usize,
    mut fetch: F,
) -> anyhow::Result<(Vec<T>, bool)>
where
    F: FnMut(usize, Option<String>) -> Fut,
    Fut: Future<Output = Result<Page<T>, ClientError>>,
{
    let mut items = Vec::new();
    let mut cursor = None;
    loop {
        let chunk = chunk.clamp(1, MAX_PAGE);
        let want = if all {
            chunk
        } else {
            (limit - items.len()).min(chunk)
        };
        if want == 0 {
            return Ok((items, cursor.is_some()));
        }
        let page = fetch(want, cursor.take()).await?;
        items.extend(page.items);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok((items, false)),
        }
    }
}

/// A query string from the pairs that have a value, percent-encoded.
pub fn query(pairs: &[(&str, Option<String>)]) -> String {
    pairs
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", urlencode(v))))
        .collect::<Vec<_>>()
        .join("&")
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn api_field_names_become_flags() {
        let fields = [
            ("targeting.agent_ids", "--agent-id"),
            ("yaml_content", "-f FILE"),
        ];
        assert_eq!(
            super::rename_fields(
                "yaml_content holds nothing; see targeting.agent_ids.",
                &fields
            ),
            "-f FILE holds nothing; see --agent-id."
        );
        assert_eq!(
            super::rename_fields("my_yaml_content", &fields),
            "my_yaml_content"
        );
    }
}
