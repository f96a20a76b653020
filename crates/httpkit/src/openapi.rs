//! The problem half of a service's OpenAPI document.

use axum::http::StatusCode;
use utoipa::openapi::schema::Schema;
use utoipa::openapi::{ContentBuilder, OpenApi, Ref, RefOr, ResponseBuilder};
use utoipa::{PartialSchema, ToSchema};

use crate::{PROBLEM_JSON, Problem, ProblemSource};

/// Adds the `Problem` schema to `doc`'s components, its `type` described
/// as `E`'s prefix followed by the code, and to every operation of every
/// path the problem responses of `statuses_of(path)`: for each status not
/// already documented, `<reason phrase> (problem details)` with an
/// `application/problem+json` body of that schema.
///
/// # Panics
/// When `statuses_of` names a status without a standard reason phrase (a
/// programming error in the service's table).
pub fn document_problems<E: ProblemSource>(
    doc: &mut OpenApi,
    statuses_of: impl Fn(&str) -> &'static [u16],
) {
    doc.components
        .get_or_insert_with(Default::default)
        .schemas
        .insert(Problem::name().into_owned(), problem_schema(E::TYPE_PREFIX));
    for (path, item) in doc.paths.paths.iter_mut() {
        let statuses = statuses_of(path);
        for op in [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ]
        .into_iter()
        .flatten()
        {
            for status in statuses {
                let reason = StatusCode::from_u16(*status)
                    .ok()
                    .and_then(|s| s.canonical_reason())
                    .unwrap_or_else(|| panic!("problem status {status} has no reason phrase"));
                op.responses
                    .responses
                    .entry(status.to_string())
                    .or_insert_with(|| problem_response(reason));
            }
        }
    }
}

fn problem_response(reason: &str) -> RefOr<utoipa::openapi::Response> {
    RefOr::T(
        ResponseBuilder::new()
            .description(format!("{reason} (problem details)"))
            .content(
                PROBLEM_JSON,
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name(Problem::name())))
                    .build(),
            )
            .build(),
    )
}

/// The `Problem` schema with its `type` property described as
/// `` `<type_prefix><code>`. ``.
fn problem_schema(type_prefix: &str) -> RefOr<Schema> {
    let mut schema = Problem::schema();
    let RefOr::T(Schema::Object(object)) = &mut schema else {
        panic!("Problem derives an object schema");
    };
    let Some(RefOr::T(Schema::Object(problem_type))) = object.properties.get_mut("type") else {
        panic!("the Problem schema has a `type` property");
    };
    problem_type.description = Some(format!("`{type_prefix}<code>`."));
    schema
}

/// Adds the HTTP bearer security scheme named `bearer` to `doc`, with
/// `description` saying which credentials the service takes.
pub fn add_bearer_scheme(doc: &mut OpenApi, description: &str) {
    use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
    doc.components
        .get_or_insert_with(Default::default)
        .add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(description))
                    .build(),
            ),
        );
}

/// The response serving a service's OpenAPI document: `doc`'s JSON,
/// rendered by `render` once per process and kept in `cache`, as
/// `application/json`.
pub fn document_response(
    cache: &'static std::sync::OnceLock<String>,
    render: impl FnOnce() -> String,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let doc = cache.get_or_init(render);
    let mut resp = doc.clone().into_response();
    resp.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_description_names_the_prefix() {
        let schema = serde_json::to_value(problem_schema("urn:x:problem:")).unwrap();
        assert_eq!(
            schema["properties"]["type"],
            serde_json::json!({"type": "string", "description": "`urn:x:problem:<code>`."})
        );
        assert_eq!(
            schema["required"],
            serde_json::json!(["type", "title", "status", "detail", "code"])
        );
    }
}
