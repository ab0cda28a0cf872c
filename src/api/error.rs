//! The API's error body (docs/design.md §5): `{"error": {"code": "snake_case", "message": "..."}}`,
//! and extractors whose rejections use it, so malformed input is never a bare-text or `500` answer.

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use crate::auth::AuthError;
use crate::queue::limits::PAGE_LIMIT;
use crate::queue::{ConflictCode, QueueError};
pub use crate::wire::{ErrorBody, ErrorDetail};

/// An error answer: status, code, message, and optionally `Retry-After` seconds.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// `503 database_unavailable` with `Retry-After: 1` (docs/design.md §5). The response carries a
    /// [`DatabaseUnavailable`] extension so the server learns of the outage and answers the
    /// next requests at once instead of waiting for a connection.
    pub fn database_unavailable() -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "database_unavailable",
            "the database is not reachable; retry later",
        );
        e.retry_after = Some(1);
        e
    }
}

/// Marks a response that found the database unavailable (see [`ApiError::database_unavailable`]).
#[derive(Debug, Clone, Copy)]
pub struct DatabaseUnavailable;

/// The body's `error` of an answer (its status and `Retry-After` are the response's).
impl From<ApiError> for ErrorDetail {
    fn from(e: ApiError) -> Self {
        ErrorDetail {
            code: e.code.to_string(),
            message: e.message,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, retry_after) = (self.status, self.retry_after);
        let body = ErrorBody { error: self.into() };
        let unavailable = body.error.code == "database_unavailable";
        let mut response = (status, Json(body)).into_response();
        if unavailable {
            response.extensions_mut().insert(DatabaseUnavailable);
        }
        if let Some(secs) = retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        response
    }
}

impl From<QueueError> for ApiError {
    fn from(e: QueueError) -> Self {
        let message = e.to_string();
        match e {
            QueueError::Invalid { .. } => Self::bad_request("invalid_field", message),
            QueueError::UnknownWorkType { .. } => Self::bad_request("unknown_work_type", message),
            QueueError::TooLarge { .. } => {
                Self::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message)
            }
            QueueError::NotFound { .. } => Self::new(StatusCode::NOT_FOUND, "not_found", message),
            QueueError::Finished { .. } => Self::new(StatusCode::NOT_FOUND, "finished", message),
            // The IETF Idempotency-Key draft's answer to a key reused with another payload.
            QueueError::Conflict {
                code: code @ ConflictCode::IdempotencyKeyReused,
                ..
            } => Self::new(StatusCode::UNPROCESSABLE_ENTITY, code.as_str(), message),
            QueueError::Conflict { code, .. } => {
                Self::new(StatusCode::CONFLICT, code.as_str(), message)
            }
            QueueError::Cursor(_) => Self::bad_request("invalid_cursor", message),
            QueueError::Unavailable(error) => {
                tracing::warn!(%error, "database unavailable while serving a request");
                Self::database_unavailable()
            }
            QueueError::Database(error) => {
                tracing::error!(%error, "database error while serving a request");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error; see the server log",
                )
            }
        }
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Unauthenticated(m) => Self::new(StatusCode::UNAUTHORIZED, "unauthorized", m),
            AuthError::Forbidden(m) => Self::new(StatusCode::FORBIDDEN, "forbidden", m),
            AuthError::Queue(q) => q.into(),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        let code = match &r {
            JsonRejection::JsonDataError(_) => "invalid_body",
            JsonRejection::JsonSyntaxError(_) => "malformed_json",
            JsonRejection::MissingJsonContentType(_) => "unsupported_media_type",
            _ if r.status() == StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
            _ => "invalid_body",
        };
        Self::new(r.status(), code, r.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        Self::bad_request("invalid_query", r.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        Self::bad_request("invalid_path", r.body_text())
    }
}

/// `axum::Json` with rejections in the API's error body: `400 malformed_json` for syntax,
/// `422 invalid_body` for wrong types, missing or unknown fields, `413` past the body limit.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let Json(value) = Json::<serde_json::Value>::from_request(req, state).await?;
        Ok(ApiJson(from_json_object(value)?))
    }
}

/// Every request body is a JSON object (serde would otherwise read a struct from an array,
/// field by field, so `[null, null]` passed for `{}`). Numbers with a zero fraction (`60.0`)
/// are integers as JSON Schema counts them, so integer fields take them; `60.5` stays a type
/// error. Wrong types, missing and unknown fields are `422 invalid_body`.
pub(crate) fn from_json_object<T: DeserializeOwned>(
    mut value: serde_json::Value,
) -> Result<T, ApiError> {
    if !value.is_object() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
            "invalid request body: expected a JSON object",
        ));
    }
    integral_floats_to_integers(&mut value);
    serde_json::from_value(value).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
            format!("invalid request body: {e}"),
        )
    })
}

fn integral_floats_to_integers(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Number(n) if !n.is_i64() && !n.is_u64() => {
            if let Some(f) = n.as_f64()
                && f.fract() == 0.0
                && f >= i64::MIN as f64
                && f < i64::MAX as f64
            {
                *value = Value::from(f as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral_floats_to_integers),
        Value::Object(map) => map.values_mut().for_each(integral_floats_to_integers),
        _ => {}
    }
}

/// `axum::extract::Query` with rejections in the API's error body (`400 invalid_query`).
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Query(value) =
            axum::extract::Query::<T>::from_request_parts(parts, state).await?;
        Ok(ApiQuery(value))
    }
}

/// `axum::extract::Path` with rejections in the API's error body (`400 invalid_path`).
pub struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Path(value) =
            axum::extract::Path::<T>::from_request_parts(parts, state).await?;
        Ok(ApiPath(value))
    }
}

/// Parses an optional JSON body: no bytes at all means `T::default()`. A body of only whitespace is
/// not JSON and is refused like any other malformed body (schemathesis sent `\t` and got `204`).
/// Errors as for [`ApiJson`].
pub fn parse_optional_json<T: DeserializeOwned + Default>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.is_empty() {
        return Ok(T::default());
    }
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::bad_request(
            "malformed_json",
            format!("request body is not valid JSON: {e}"),
        )
    })?;
    from_json_object(value)
}

/// `limit` of list routes within [`PAGE_LIMIT`], its default when absent (docs/design.md §5);
/// `400 invalid_query` naming `limit` and both ends otherwise.
pub fn page_limit(limit: Option<i64>) -> Result<i64, ApiError> {
    let (min, max) = (PAGE_LIMIT.min, PAGE_LIMIT.max);
    match limit {
        None => Ok(i64::from(PAGE_LIMIT.default_i32())),
        Some(l) if (min..=max).contains(&l) => Ok(l),
        Some(l) => Err(ApiError::bad_request(
            "invalid_query",
            format!(
                "{} must be between {min} and {max}, got {l}",
                PAGE_LIMIT.field
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Default, Debug)]
    struct Body {
        n: Option<i64>,
    }

    #[test]
    fn optional_json_is_absent_only_when_empty() {
        assert_eq!(parse_optional_json::<Body>(b"").unwrap().n, None);
        assert_eq!(
            parse_optional_json::<Body>(b"{\"n\":2}").unwrap().n,
            Some(2)
        );
        for not_json in [&b"\t"[..], b" ", b"\n\n", b"x"] {
            let err = parse_optional_json::<Body>(not_json).unwrap_err();
            assert_eq!(err.status, StatusCode::BAD_REQUEST, "{not_json:?}");
            assert_eq!(err.code, "malformed_json");
        }
    }

    /// Schemathesis sent `"seq": 2236413752122673.0`; serde_json's default float parser read it
    /// one ulp off (`…672.8`), so an integral number was refused as a fraction. The
    /// `float_roundtrip` feature parses exactly.
    #[test]
    fn large_integral_floats_are_integers() {
        for (text, want) in [
            ("{\"n\": 2236413752122673.0}", 2_236_413_752_122_673_i64),
            ("{\"n\": 4503599627370495.0}", 4_503_599_627_370_495),
            ("{\"n\": -60.0}", -60),
        ] {
            let value: serde_json::Value = serde_json::from_str(text).unwrap();
            let body: Body = from_json_object(value).unwrap_or_else(|e| panic!("{text}: {e:?}"));
            assert_eq!(body.n, Some(want), "{text}");
        }
    }
}
