//! Reading values out of a Prometheus text page (exposition format 0.0.4), enough for the
//! engine adapters: the sum of a metric's samples over all label sets.

/// The sum of every sample of `name` (any labels), or `None` if the page has none.
/// `name` must match exactly: `vllm:prompt_tokens_total` does not match
/// `vllm:prompt_tokens_total_created`.
pub fn sum(text: &str, name: &str) -> Option<f64> {
    let mut total = None;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let rest = match rest.as_bytes().first() {
            Some(b'{') => match labels_end(rest) {
                Some(end) => &rest[end + 1..],
                None => continue,
            },
            Some(b' ') | Some(b'\t') => rest,
            _ => continue,
        };
        let Some(value) = rest.split_whitespace().next() else {
            continue;
        };
        if let Ok(value) = value.parse::<f64>() {
            if value.is_finite() {
                *total.get_or_insert(0.0) += value;
            }
        }
    }
    total
}

/// The index of the `}` closing a label set that starts at `text[0] == '{'`, skipping
/// quoted label values (which may hold braces and escaped quotes).
fn labels_end(text: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, b) in text.bytes().enumerate() {
        match (quoted, escaped, b) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (_, _, b'"') => quoted = !quoted,
            (false, _, b'}') => return Some(i),
            _ => {}
        }
    }
    None
}

/// The first of `names` the page has.
pub fn first(text: &str, names: &[&str]) -> Option<f64> {
    names.iter().find_map(|name| sum(text, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "# HELP x_total x\n# TYPE x_total counter\nx_total{model=\"a\"} 3\nx_total{model=\"b\",le=\"}\"} 4.5\nx_total_created 17\ny 2e3\nbad{ 5\nz NaN\n";

    #[test]
    fn sums_labelled_samples_of_exactly_one_name() {
        assert_eq!(sum(PAGE, "x_total"), Some(7.5));
        assert_eq!(sum(PAGE, "y"), Some(2000.0));
        assert_eq!(sum(PAGE, "x"), None);
        assert_eq!(sum(PAGE, "bad"), None);
        assert_eq!(sum(PAGE, "z"), None);
        assert_eq!(first(PAGE, &["nope", "y"]), Some(2000.0));
    }
}
