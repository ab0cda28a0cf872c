//! Multi-document YAML as carried in `yaml_content` (docs/design.md §4, §5): parsed once at creation to
//! reject what can never apply, and again by the executor to apply it.

use serde::Deserialize;
use serde_json::Value;

/// Deepest nesting of mappings and sequences accepted in `yaml_content`: the recursion limit of
/// the YAML deserializer, so no object that would have parsed before is refused now. Kubernetes
/// objects, CRD schemas included, nest far less.
pub const MAX_NESTING: usize = 128;

/// A problem with `yaml_content`, phrased for the person who wrote it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ManifestError(pub String);

/// Parses every YAML document in `yaml`, dropping empty ones (a document that is only comments is
/// empty). Each remaining document must be a mapping with string `apiVersion` and `kind` and a
/// `metadata` mapping. Documents are returned as JSON values in their original order.
///
/// Errors name the document (1-based) and what is wrong with it.
pub fn parse_documents(yaml: &str) -> Result<Vec<Value>, ManifestError> {
    check_nesting(yaml, MAX_NESTING)?;
    let mut docs = Vec::new();
    for (index, document) in serde_norway::Deserializer::from_str(yaml).enumerate() {
        let n = index + 1;
        let value = serde_norway::Value::deserialize(document)
            .map_err(|e| ManifestError(format!("yaml_content document {n} does not parse: {e}")))?;
        if value.is_null() {
            continue;
        }
        let json = serde_json::to_value(&value).map_err(|e| {
            ManifestError(format!(
                "yaml_content document {n} cannot be represented as JSON: {e}"
            ))
        })?;
        check_object(n, &json)?;
        docs.push(json);
    }
    Ok(docs)
}

/// Refuses YAML nested deeper than `max_depth` before it is parsed for real (issue #14: 200 KB
/// of `[` took the parser ~40 s of CPU). The YAML scanner's cost per token grows with the
/// nesting depth (it checks every open flow level for a pending simple key), so deep nesting is
/// quadratic. This walks the same parser's events and stops at the first collection past the
/// limit, having scanned only what came before it: linear time for any input.
///
/// It uses the parser that `serde_norway` is built on, so both agree on what is nested; syntax
/// errors are left to the real parse, which reports them with their position.
pub fn check_nesting(yaml: &str, max_depth: usize) -> Result<(), ManifestError> {
    use unsafe_libyaml_norway as unsafe_yaml;
    // SAFETY: the libyaml calls follow its C API's contract: the parser is initialized before
    // use, lives at a fixed heap address (libyaml keeps pointers into itself) and is deleted
    // exactly once; the input outlives the parser; every event that parsed is deleted.
    unsafe {
        let mut parser: Box<std::mem::MaybeUninit<unsafe_yaml::yaml_parser_t>> = Box::new_uninit();
        let parser = parser.as_mut_ptr();
        if unsafe_yaml::yaml_parser_initialize(parser).fail {
            return Err(ManifestError(
                "yaml_content could not be checked (out of memory)".into(),
            ));
        }
        unsafe_yaml::yaml_parser_set_encoding(parser, unsafe_yaml::YAML_UTF8_ENCODING);
        unsafe_yaml::yaml_parser_set_input_string(parser, yaml.as_ptr(), yaml.len() as u64);
        let mut depth = 0usize;
        let mut document = 0usize;
        let verdict = loop {
            let mut event = std::mem::MaybeUninit::<unsafe_yaml::yaml_event_t>::uninit();
            if unsafe_yaml::yaml_parser_parse(parser, event.as_mut_ptr()).fail {
                break Ok(());
            }
            let kind = (*event.as_ptr()).type_;
            unsafe_yaml::yaml_event_delete(event.as_mut_ptr());
            match kind {
                unsafe_yaml::YAML_DOCUMENT_START_EVENT => document += 1,
                unsafe_yaml::YAML_SEQUENCE_START_EVENT | unsafe_yaml::YAML_MAPPING_START_EVENT => {
                    depth += 1;
                    if depth > max_depth {
                        break Err(ManifestError(format!(
                            "yaml_content document {document} is nested more than {max_depth} \
                             levels deep"
                        )));
                    }
                }
                unsafe_yaml::YAML_SEQUENCE_END_EVENT | unsafe_yaml::YAML_MAPPING_END_EVENT => {
                    depth = depth.saturating_sub(1)
                }
                unsafe_yaml::YAML_STREAM_END_EVENT => break Ok(()),
                _ => {}
            }
        };
        unsafe_yaml::yaml_parser_delete(parser);
        verdict
    }
}

fn check_object(n: usize, doc: &Value) -> Result<(), ManifestError> {
    let Some(map) = doc.as_object() else {
        return Err(ManifestError(format!(
            "yaml_content document {n} is not a mapping (a Kubernetes object)"
        )));
    };
    for key in ["apiVersion", "kind"] {
        match map.get(key) {
            Some(Value::String(s)) if !s.is_empty() => {}
            Some(_) => {
                return Err(ManifestError(format!(
                    "yaml_content document {n}: {key} must be a non-empty string"
                )));
            }
            None => {
                return Err(ManifestError(format!(
                    "yaml_content document {n} has no {key}"
                )));
            }
        }
    }
    match map.get("metadata") {
        Some(Value::Object(_)) => Ok(()),
        Some(_) => Err(ManifestError(format!(
            "yaml_content document {n}: metadata must be a mapping"
        ))),
        None => Err(ManifestError(format!(
            "yaml_content document {n} has no metadata"
        ))),
    }
}

/// `apiVersion` of a parsed document (present after [`parse_documents`]).
pub fn api_version(doc: &Value) -> &str {
    doc.get("apiVersion").and_then(Value::as_str).unwrap_or("")
}

/// `kind` of a parsed document (present after [`parse_documents`]).
pub fn kind(doc: &Value) -> &str {
    doc.get("kind").and_then(Value::as_str).unwrap_or("")
}

/// True for a `batch/v1` Job: the executor watches these to a verdict.
pub fn is_job(doc: &Value) -> bool {
    api_version(doc) == "batch/v1" && kind(doc) == "Job"
}

/// True for a Shipwright `Build` of the version Pullman speaks (docs/design.md §4).
pub fn is_shipwright_build(doc: &Value) -> bool {
    api_version(doc) == "shipwright.io/v1beta1" && kind(doc) == "Build"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_comment_only_documents_are_dropped() {
        let yaml = "---\n# only a comment\n---\n\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n---\n";
        let docs = parse_documents(yaml).unwrap();
        assert_eq!(docs.len(), 1);
        assert_eq!(kind(&docs[0]), "ConfigMap");
    }

    #[test]
    fn each_document_needs_api_version_kind_and_metadata() {
        let err = parse_documents("apiVersion: v1\nkind: ConfigMap\n").unwrap_err();
        assert_eq!(err.0, "yaml_content document 1 has no metadata");
        let err = parse_documents("kind: A\nmetadata: {}\n---\napiVersion: v1\n").unwrap_err();
        assert_eq!(err.0, "yaml_content document 1 has no apiVersion");
        let err = parse_documents("- a\n- b\n").unwrap_err();
        assert!(err.0.contains("not a mapping"), "{err}");
    }

    #[test]
    fn deep_nesting_is_refused_before_the_parser_spends_quadratic_time() {
        // 200,000 levels: the input, which took ~40 s to parse before the bound.
        let yaml = format!("x: {}{}", "[".repeat(200_000), "]".repeat(200_000));
        let started = std::time::Instant::now();
        let err = parse_documents(&yaml).unwrap_err();
        assert!(err.0.contains("nested more than 128 levels"), "{err}");
        // Generous: the check stops after ~1 KiB of input; the unbounded parse took tens of s.
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        // Block nesting and flow mappings count the same way.
        let deep_block: String = (0..200).map(|i| format!("{}k:\n", " ".repeat(i))).collect();
        assert!(
            parse_documents(&deep_block)
                .unwrap_err()
                .0
                .contains("nested")
        );
        let flow_maps = format!("x: {}{}", "{a: ".repeat(300), "}".repeat(300));
        assert!(
            parse_documents(&flow_maps)
                .unwrap_err()
                .0
                .contains("nested")
        );
    }

    #[test]
    fn nesting_up_to_the_limit_parses() {
        let depth = MAX_NESTING - 2; // the document's own mapping and `metadata` count too
        let yaml = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: a}}\ndata: {}1{}\n",
            "[".repeat(depth),
            "]".repeat(depth)
        );
        // `data` must be a map for the API server, but as YAML this parses.
        assert_eq!(parse_documents(&yaml).unwrap().len(), 1);
        // A second document is counted on its own.
        let two = format!("{yaml}---\n{yaml}");
        assert_eq!(parse_documents(&two).unwrap().len(), 2);
    }

    #[test]
    fn unparsable_yaml_names_the_document() {
        let err = parse_documents("apiVersion: v1\nkind: A\nmetadata: {}\n---\nfoo: [unclosed\n")
            .unwrap_err();
        assert!(
            err.0.starts_with("yaml_content document 2 does not parse"),
            "{err}"
        );
    }
}
