//! The page: one HTML file with its script inline and uPlot (vendored in `assets/uplot`,
//! MIT) embedded, so it needs no network: served live (it polls the `/api` endpoints), or
//! written as a report with the endpoints' answers embedded.

use serde_json::Value;

const TEMPLATE: &str = include_str!("../../assets/dashboard.html");
const UPLOT_JS: &str = include_str!("../../assets/uplot/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../../assets/uplot/uPlot.min.css");

/// The live page: it fetches its data from the server that serves it.
pub(crate) fn live() -> String {
    render(None)
}

/// A report: the page with `data` (`{"summary":..,"history":..,"buckets":..,"failures":..,
/// "workers":..}`) embedded.
pub(crate) fn report(data: &Value) -> String {
    render(Some(data))
}

fn render(data: Option<&Value>) -> String {
    let embedded = data.map(|d| script_safe(&d.to_string()));
    TEMPLATE
        .replacen("/*UPLOT_CSS*/", UPLOT_CSS, 1)
        .replacen("/*UPLOT_JS*/", UPLOT_JS, 1)
        .replacen("/*EMBEDDED*/null", embedded.as_deref().unwrap_or("null"), 1)
}

/// JSON that cannot end the `<script>` element it sits in: every `<` (only ever inside a
/// JSON string) is written `\u003c`, which a JSON parser reads back as `<`.
fn script_safe(json: &str) -> String {
    json.replace('<', "\\u003c")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_embeds_its_data_and_uplot_and_nothing_ends_its_script_early() {
        let data = serde_json::json!({"summary": {"job_id": "</script><script>alert(1)</script>"}});
        let page = report(&data);
        assert!(page.contains("uPlot"));
        assert!(!page.contains("/*UPLOT_JS*/") && !page.contains("/*EMBEDDED*/"));
        assert!(!page.contains("</script><script>alert"));
        // The embedded JSON still parses to the same value.
        let start = page.find("id=\"embedded\">").unwrap() + "id=\"embedded\">".len();
        let end = start + page[start..].find("</script>").unwrap();
        let parsed: Value = serde_json::from_str(&page[start..end]).unwrap();
        assert_eq!(parsed, data);
        // uPlot's code holds nothing that would end the script element it is inlined in,
        // and the page loads nothing from elsewhere.
        assert!(!UPLOT_JS.contains("</"));
        assert!(!live().contains("src=\"http") && !live().contains("href=\"http"));
    }
}
