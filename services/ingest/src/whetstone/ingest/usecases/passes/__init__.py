"""The data gate's passes, in the order `usecases/pipeline.DataGate.run` calls them:

    rows.RowPass          read/parse -> layout + schema -> normalise -> PII -> length   (per row)
    dedup.ExactDedup      exact duplicates, train/validation overlap                   (per batch)
    screen.Contamination  13-gram overlap with the reference sets                      (per batch)
    screen.Toxicity       the toxicity classifier                                      (per batch)
    store.CandidateStore  MinHash bands + the surviving rows, on disk                  (per batch)
    dedup.NearDedup       LSH candidates -> exact Jaccard -> clusters                  (once)
    tokenise.Tokenise     the base model's tokenizer, over-length policy, mask preview (per row)
    write.WritePass       split, stats, train/validation/tokenized files               (once, streaming)
    summary.build_report  the typed GateReport                                         (once)

Every finding goes through `findings.Findings`, where the policy -> action rule
(`domain.actions`) is applied, the audit line written and the issue logged.
"""
