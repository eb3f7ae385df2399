//! A realistic answer: the company profile an enrichment API returns for an ID, as JSON of
//! about 1.5-2.5 KB with what real answers have and a padding string has not: nested
//! objects, arrays of objects, the same keys in every answer, numbers, dates, URLs, short
//! codes and long free text drawn from a vocabulary. Deterministic from the ID alone, so a
//! test or bench can predict it ([`profile_body`]). The storage bench measures the state's
//! bytes per ID on these answers: their size at rest is what compression must win on.

use serde_json::{json, Value};
use xxhash_rust::xxh3::xxh3_64;

use super::faults::mix64;

const SECTORS: [(&str, &str, &str); 8] = [
    ("Industrials", "Transportation", "Air Freight & Logistics"),
    (
        "Information Technology",
        "Software & Services",
        "Application Software",
    ),
    (
        "Health Care",
        "Health Care Equipment & Services",
        "Health Care Providers",
    ),
    ("Financials", "Diversified Financials", "Capital Markets"),
    (
        "Consumer Discretionary",
        "Retailing",
        "Internet & Direct Marketing Retail",
    ),
    ("Materials", "Chemicals", "Specialty Chemicals"),
    (
        "Energy",
        "Energy Equipment & Services",
        "Oil & Gas Drilling",
    ),
    (
        "Communication Services",
        "Media & Entertainment",
        "Interactive Media & Services",
    ),
];
const FIRST: [&str; 12] = [
    "Ada", "Bruno", "Chiara", "Dmitri", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas",
    "Keiko", "Lars",
];
const LAST: [&str; 12] = [
    "Okafor",
    "Lindqvist",
    "Moreau",
    "Tanaka",
    "Silva",
    "Kowalski",
    "Nguyen",
    "Schmidt",
    "Haddad",
    "Rossi",
    "Fischer",
    "Patel",
];
const TITLES: [&str; 8] = [
    "Chief Executive Officer",
    "VP Engineering",
    "Head of Procurement",
    "Chief Financial Officer",
    "Director of Operations",
    "Data Platform Lead",
    "General Counsel",
    "Head of Partnerships",
];
const CITIES: [(&str, &str, &str, &str); 8] = [
    ("Hamburg", "Hamburg", "HH", "DE"),
    ("Lyon", "Auvergne-Rhône-Alpes", "ARA", "FR"),
    ("Austin", "Texas", "TX", "US"),
    ("Osaka", "Osaka", "27", "JP"),
    ("Porto", "Porto", "13", "PT"),
    ("Toronto", "Ontario", "ON", "CA"),
    ("Kraków", "Lesser Poland", "MA", "PL"),
    ("Melbourne", "Victoria", "VIC", "AU"),
];
const SENIORITY: [&str; 3] = ["executive", "director", "manager"];
const RANKS: [&str; 4] = ["very_high", "high", "medium", "low"];
const TECH: [&str; 16] = [
    "google_analytics",
    "segment",
    "hubspot",
    "salesforce",
    "stripe",
    "aws_cloudfront",
    "cloudflare",
    "react",
    "zendesk",
    "intercom",
    "postgresql",
    "kafka",
    "snowflake",
    "okta",
    "datadog",
    "sentry",
];
const WORDS: [&str; 48] = [
    "platform",
    "customers",
    "global",
    "logistics",
    "software",
    "data",
    "enterprise",
    "solutions",
    "network",
    "partners",
    "delivery",
    "analytics",
    "secure",
    "cloud",
    "services",
    "industry",
    "leading",
    "provider",
    "teams",
    "operations",
    "markets",
    "through",
    "since",
    "founded",
    "headquartered",
    "offices",
    "across",
    "countries",
    "helps",
    "companies",
    "manage",
    "their",
    "supply",
    "chain",
    "payments",
    "risk",
    "compliance",
    "with",
    "real-time",
    "insight",
    "and",
    "the",
    "of",
    "in",
    "for",
    "to",
    "more",
    "than",
];

/// The answer for `id`: a company profile of about 1.5-2.5 KB (see the module doc).
pub fn profile_body(id: &str) -> Value {
    let mut seed = xxh3_64(id.as_bytes());
    let mut next = move || {
        seed = mix64(seed.wrapping_add(0x9E37_79B9_7F4A_7C15));
        seed
    };
    let pick = |n: u64, len: usize| (n % len as u64) as usize;
    let number = next();
    let name = format!(
        "{} {} {}",
        LAST[pick(number, LAST.len())],
        [
            "Logistics",
            "Systems",
            "Health",
            "Capital",
            "Labs",
            "Materials",
            "Energy",
            "Media"
        ][pick(number >> 8, 8)],
        [
            "GmbH",
            "SA",
            "Inc.",
            "KK",
            "Lda",
            "Ltd.",
            "sp. z o.o.",
            "Pty Ltd"
        ][pick(number >> 16, 8)]
    );
    let slug: String = name
        .split(' ')
        .next()
        .unwrap_or("company")
        .to_lowercase()
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect();
    let domain = format!("{slug}-{:x}.example.com", number >> 44);
    let (sector, group, industry) = SECTORS[pick(next(), SECTORS.len())];
    let (city, state, state_code, country) = CITIES[pick(next(), CITIES.len())];
    let words = 25 + pick(next(), 50);
    let description: Vec<&str> = (0..words)
        .map(|_| WORDS[pick(next(), WORDS.len())])
        .collect();
    let contacts: Vec<Value> = (0..1 + pick(next(), 4))
        .map(|_| {
            let r = next();
            let (first, last) = (FIRST[pick(r, FIRST.len())], LAST[pick(r >> 8, LAST.len())]);
            json!({
                "name": format!("{first} {last}"),
                "title": TITLES[pick(r >> 16, TITLES.len())],
                "email": format!("{}.{}@{domain}", first.to_lowercase(), last.to_lowercase()),
                "phone": format!("+{} {:03} {:04} {:04}", 1 + r % 90, (r >> 20) % 1000, (r >> 30) % 10000, (r >> 44) % 10000),
                "seniority": SENIORITY[pick(r >> 50, 3)],
                "verified": r & 1 == 0,
            })
        })
        .collect();
    let tech: Vec<&str> = (0..3 + pick(next(), 6))
        .map(|_| TECH[pick(next(), TECH.len())])
        .collect();
    let employees = 5 + next() % 50_000;
    let day = |r: u64| {
        format!(
            "20{:02}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            10 + r % 16,
            1 + (r >> 8) % 12,
            1 + (r >> 16) % 28,
            (r >> 24) % 24,
            (r >> 32) % 60,
            (r >> 40) % 60
        )
    };
    let r = next();
    json!({
        "id": id,
        "object": "company",
        "name": name,
        "legal_name": format!("{name} (registered {})", 1950 + r % 70),
        "domain": domain,
        "created_at": day(next()),
        "updated_at": day(next()),
        "category": {
            "sector": sector,
            "industry_group": group,
            "industry": industry,
            "sic_code": format!("{:04}", 1000 + r % 8000),
            "naics_code": format!("{:06}", 100_000 + (r >> 16) % 800_000),
        },
        "tags": [industry, if employees > 1000 { "Enterprise" } else { "SMB" }, "B2B"],
        "description": description.join(" "),
        "geo": {
            "street_number": format!("{}", 1 + (r >> 24) % 400),
            "street_name": format!("{} Street", LAST[pick(r >> 32, LAST.len())]),
            "city": city,
            "postal_code": format!("{:05}", (r >> 40) % 100_000),
            "state": state,
            "state_code": state_code,
            "country_code": country,
            "lat": ((next() % 180_000_000) as f64 / 1e6 - 90.0),
            "lng": ((next() % 360_000_000) as f64 / 1e6 - 180.0),
        },
        "metrics": {
            "employees": employees,
            "employees_range": match employees { 0..=50 => "1-50", 51..=250 => "51-250", 251..=1000 => "251-1K", 1001..=5000 => "1K-5K", _ => "5K+" },
            "annual_revenue": employees * (40_000 + next() % 200_000),
            "raised": if r & 2 == 0 { Value::Null } else { json!(next() % 500_000_000) },
            "market_cap": Value::Null,
            "traffic_rank": RANKS[pick(r >> 48, 4)],
        },
        "contacts": contacts,
        "tech": tech,
        "scores": { "fit": (next() % 1000) as f64 / 1000.0, "intent": (next() % 1000) as f64 / 1000.0 },
        "links": {
            "self": format!("https://api.example.com/v2/companies/{id}"),
            "linkedin": format!("https://www.linkedin.com/company/{slug}-{:x}", r >> 52),
            "twitter": if r & 4 == 0 { Value::Null } else { json!(format!("@{slug}")) },
        },
        "indexed": r & 8 == 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_are_deterministic_sized_like_real_answers_and_differ_by_id() {
        let a = profile_body("id-1");
        assert_eq!(a, profile_body("id-1"));
        assert_ne!(a["name"], Value::Null);
        let sizes: Vec<usize> = (0..200)
            .map(|i| {
                serde_json::to_vec(&profile_body(&format!("id-{i}")))
                    .unwrap()
                    .len()
            })
            .collect();
        let mean = sizes.iter().sum::<usize>() / sizes.len();
        assert!((1200..=2600).contains(&mean), "mean {mean} bytes");
        assert!(sizes.iter().min() < sizes.iter().max(), "sizes vary");
        assert!(a["contacts"].as_array().is_some_and(|c| !c.is_empty()));
    }
}
