//! How hybrid search weighs its two retrievers' evidence about a memory into one score.
//!
//! Each retriever's evidence is read on an absolute scale, not by rank:
//!
//! - the **vector** side gives the cosine similarity of the memory's best chunk to the query;
//! - the **lexical** side gives the memory's *coverage* of the query: the share of the query's
//!   information, its terms weighted by inverse document frequency (BM25's weights), that the
//!   memory's best BM25 chunk contains. A chunk holding every distinctive word of the query
//!   covers nearly all of it; one sharing a common word with a paraphrased question covers
//!   little, and query words found in no memory at all cover nothing for anyone, so they make
//!   the lexical side count less for that query.
//!
//! The score is the similarity plus [`LEXICAL_WEIGHT`] times the coverage squared. A component
//! keeps a lead it is sure of: the vectors' when their best memory is well ahead in cosine, the
//! lexical side's when a memory holds (nearly) all of the query's rare words; a weak partial
//! match only settles near ties. Squaring makes partial coverage count for less than its share
//! (half the query's information is a quarter of the bonus), as one matching word of several is
//! weak evidence that a memory is the one meant.
//!
//! Why not reciprocal rank fusion: it reads only ranks. With k = 60 the first and the fifth of a
//! list differ by 6% of a vote, while being in both lists doubles it. In a store of a few
//! hundred memories the vector list holds a fifth of them, so any memory sharing one word with a
//! paraphrased question (and therefore on both lists) passes the memory the vectors rank first
//! when the lexical list does not have it: hybrid ranks below its better component.

/// Similarity a memory gains by containing all of the query's terms. all-MiniLM-L6-v2 puts a
/// memory that answers a question about 0.1 to 0.3 above unrelated ones, so a complete keyword
/// match outweighs a clear semantic lead only when that lead is small. Chosen on half of the
/// questions of `examples/ranking` and checked on the other half (`docs/benchmarks-memory.md`).
pub const LEXICAL_WEIGHT: f64 = 0.3;

/// BM25's inverse document frequency, kept positive (`ln(1 + (N - n + 0.5) / (n + 0.5))`), of a
/// term found in `docs` of `chunks` chunks.
pub fn idf(docs: usize, chunks: usize) -> f64 {
    let (n, d) = (chunks.max(docs) as f64, docs as f64);
    (1.0 + (n - d + 0.5) / (d + 0.5)).ln()
}

/// Share of the query's information in a text containing the terms marked in `present`, the
/// query's terms weighing `idf` each: 0 to 1.
pub fn coverage(idf: &[f64], present: &[bool]) -> f64 {
    let total: f64 = idf.iter().sum();
    if total <= 0.0 {
        return 0.0;
    }
    let held: f64 = idf
        .iter()
        .zip(present)
        .filter(|(_, p)| **p)
        .map(|(w, _)| w)
        .sum();
    (held / total).clamp(0.0, 1.0)
}

/// A memory's hybrid score from its similarity and its coverage of the query.
pub fn hybrid_score(similarity: f32, coverage: f64) -> f64 {
    f64::from(similarity) + LEXICAL_WEIGHT * coverage * coverage
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rare_terms_weigh_more_than_common_ones() {
        assert!(idf(1, 1000) > idf(100, 1000));
        assert!(idf(100, 1000) > idf(900, 1000));
        assert!(
            idf(1000, 1000) > 0.0,
            "a term in every chunk still counts a little"
        );
        assert!(idf(5, 3) > 0.0, "a count above the chunk count is clamped");
    }

    #[test]
    fn coverage_is_the_idf_weighted_share_of_the_query() {
        let w = [idf(1, 100), idf(50, 100)];
        assert_eq!(coverage(&w, &[true, true]), 1.0);
        assert_eq!(coverage(&w, &[false, false]), 0.0);
        let rare = coverage(&w, &[true, false]);
        let common = coverage(&w, &[false, true]);
        assert!(rare > 0.8 && common < 0.2, "rare {rare}, common {common}");
        assert_eq!(coverage(&[], &[]), 0.0);
    }

    #[test]
    fn a_partial_lexical_match_does_not_overturn_a_clear_vector_lead() {
        // The vectors' best memory, holding none of the query's words, against one sharing a
        // common word of three, 0.1 behind in cosine.
        let w = [idf(0, 200), idf(3, 200), idf(40, 200)];
        let paraphrase = hybrid_score(0.55, coverage(&w, &[false, false, false]));
        let shares_a_word = hybrid_score(0.45, coverage(&w, &[false, false, true]));
        assert!(paraphrase > shares_a_word);
        // A memory holding every word of the query passes a closer cosine lead.
        let exact = hybrid_score(0.45, coverage(&w, &[true, true, true]));
        assert!(exact > hybrid_score(0.55, 0.0));
    }
}
