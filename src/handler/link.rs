//! Link: the `Link` header of an answer (RFC 8288), read for the link to the next page.
//!
//! A header value holds links separated by commas, each a target in `<>` followed by
//! parameters (`; rel="next"`). A `rel` is one relation or a list separated by spaces,
//! quoted or not, compared without case. Commas and semicolons inside `<>` or inside a
//! quoted value belong to it.

/// The target of the first link of a `Link` header value (RFC 8288) whose `rel` holds
/// `next` (compared without case; `rel` quoted or not, a list of relations or one).
pub(crate) fn next_link(header: &str) -> Option<String> {
    parse_links(header)
        .into_iter()
        .find(|(_, rels)| rels.iter().any(|r| r.eq_ignore_ascii_case("next")))
        .map(|(target, _)| target)
}

/// Each link of a `Link` header value: its target and its relations. Commas and semicolons
/// inside `<>` or a quoted string are part of them; a link without `<>` is skipped.
pub(crate) fn parse_links(header: &str) -> Vec<(String, Vec<String>)> {
    let mut links = Vec::new();
    let mut rest = header;
    loop {
        rest = rest.trim_start_matches(|c: char| c == ',' || c.is_whitespace());
        if rest.is_empty() {
            return links;
        }
        let Some(after_open) = rest.strip_prefix('<') else {
            // Not a link: skip to the next comma outside quotes.
            rest = after_comma(rest);
            continue;
        };
        let Some(close) = after_open.find('>') else {
            return links;
        };
        let target = after_open[..close].trim().to_string();
        rest = &after_open[close + 1..];
        let mut rels = Vec::new();
        // Parameters: `; name=value` or `; name="value"`, up to the comma ending the link.
        loop {
            rest = rest.trim_start();
            let Some(after) = rest.strip_prefix(';') else {
                break;
            };
            let param_text = after.trim_start();
            let name_end = param_text
                .find(|c: char| c == '=' || c == ';' || c == ',' || c.is_whitespace())
                .unwrap_or(param_text.len());
            let name = &param_text[..name_end];
            let mut after_name = param_text[name_end..].trim_start();
            let mut value = String::new();
            if let Some(v) = after_name.strip_prefix('=') {
                let v = v.trim_start();
                if let Some(quoted) = v.strip_prefix('"') {
                    let mut escaped = false;
                    let mut end = quoted.len();
                    for (i, c) in quoted.char_indices() {
                        if escaped {
                            escaped = false;
                            value.push(c);
                        } else if c == '\\' {
                            escaped = true;
                        } else if c == '"' {
                            end = i + 1;
                            break;
                        } else {
                            value.push(c);
                        }
                    }
                    after_name = &quoted[end.min(quoted.len())..];
                } else {
                    let end = v.find([';', ',']).unwrap_or(v.len());
                    value = v[..end].trim().to_string();
                    after_name = &v[end..];
                }
            }
            if name.eq_ignore_ascii_case("rel") && rels.is_empty() {
                rels = value.split_whitespace().map(str::to_string).collect();
            }
            rest = after_name;
        }
        links.push((target, rels));
        rest = after_comma(rest);
    }
}

/// `text` after the next comma outside a quoted string (nothing when there is none).
fn after_comma(text: &str) -> &str {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ',' if !quoted => return &text[i + 1..],
            _ => {}
        }
    }
    ""
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rels(header: &str) -> Vec<(String, Vec<String>)> {
        parse_links(header)
    }

    #[test]
    fn the_next_link_is_found_among_several() {
        let header = r#"<https://api.example.com/r?page=1>; rel="prev", <https://api.example.com/r?page=3>; rel="next", <https://api.example.com/r?page=9>; rel="last""#;
        assert_eq!(
            next_link(header).as_deref(),
            Some("https://api.example.com/r?page=3")
        );
        assert_eq!(rels(header).len(), 3);
    }

    #[test]
    fn a_rel_list_quoted_or_not_and_any_case_counts() {
        assert_eq!(next_link(r#"</b>; rel="next last""#).as_deref(), Some("/b"));
        assert_eq!(next_link("</b>; rel=next").as_deref(), Some("/b"));
        assert_eq!(next_link("</b>; REL=\"NeXt\"").as_deref(), Some("/b"));
        assert_eq!(next_link(r#"</b>;rel="last  next""#).as_deref(), Some("/b"));
        assert_eq!(next_link(r#"</a>; rel="prev", </b>; rel=last"#), None);
        assert_eq!(next_link(""), None);
    }

    #[test]
    fn semicolons_and_commas_inside_the_brackets_belong_to_the_url() {
        let header = r#"<https://x.test/r;v=1?a=1,2&b=3;4>; rel="next", </other>; rel="last""#;
        assert_eq!(
            next_link(header).as_deref(),
            Some("https://x.test/r;v=1?a=1,2&b=3;4")
        );
    }

    #[test]
    fn other_parameters_and_quoted_commas_are_passed_over() {
        let header =
            r#"</a>; title="one, two; three"; rel="prev", </b>; type="text/html"; rel="next""#;
        assert_eq!(next_link(header).as_deref(), Some("/b"));
        let links = rels(header);
        assert_eq!(links[0], ("/a".to_string(), vec!["prev".to_string()]));
    }

    #[test]
    fn text_that_is_no_link_is_skipped() {
        assert_eq!(
            next_link(r#"junk, </b>; rel="next""#).as_deref(),
            Some("/b")
        );
        assert_eq!(next_link("<unclosed; rel=next"), None);
        assert_eq!(next_link("</b>"), None, "a link without rel");
    }
}
