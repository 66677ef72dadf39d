"""Head roles of Voita et al. (2019), section 5: positional, syntactic and rare-token heads; and
two roles from the language-model literature: induction heads (Olsson et al. 2022) and attention
sinks (Xiao et al. 2023).

alignment: subword pieces to words; statistics: the accumulators (PositionalStats, SyntacticStats,
RareStats, SinkStats) and the induction task (repeated_sequences, repeated_sequence_scores);
registry: ROLES, which model kinds each role is for, and assign_roles; collect: a model's attention
over sentences into the accumulators.

Which heads. registry.ROLE_ATTENTION per model kind (models.seq2seq.kind_of): enc_self for
encoder-decoder and encoder-only models, dec_self (causal) for decoder-only ones. collect brings
every kind's maps to the source layout below, with the model's no-op sink in EOS's place: a causal
model's BOS moved behind the pieces, an encoder-only model's [CLS] and [SEP] summed into one
column ([CLS]'s row dropped). So "excluding EOS" reads "excluding the sink" for every kind. On
causal heads a syntactic instance counts only with its backward answers, and one with none is left
out (SyntacticStats' docstring says why); the positional shares need nothing more, since the
forward offsets have valid queries but no hits.

The decisions are SPEC section 2's; where SPEC is silent the choice is written here.

EOS and padding. A source row is `pieces + [EOS] + padding`. "Excluding EOS" means the EOS
query row is not counted and the EOS key column is left out of every argmax (no
renormalisation); padding never counts.

Word level (Clark et al. 2019, "What does BERT look at?"). Syntactic and rare-token statistics are
computed on words: attention TO a word is the sum of the attention to its pieces, attention FROM a
word is the mean of its pieces' rows. The "words" here are the sentence's surface tokens (the
`token_form` column of a parse table, headcount.parses), because the model reads surface text; the
syntactic words of a multiword token ("du" = "de le") share that token, and a relation inside one
token is not scored. EOS keeps its own row and column (the last), so it can be left out.

Positional statistics stay on subword tokens. The share of an offset k counts only the queries for
which q + k is a valid key (inside the sentence, not EOS, not padding): a head that always attends
to the previous token has no valid target at the first token, and would otherwise score
1 - 1/length instead of 1.0. The paper's reading (every query in the denominator) is kept beside it.
The same shares are also reported per piece kind (PIECE_KINDS): over the word-initial pieces only
and over the continuation pieces only (`continuation_offset`, `continuation_fraction`, ...), with
pieces marked the sentencepiece way (WORD_START opens a word, as in headcount's and Marian's
vocabularies; a WordPiece "##" vocabulary would need its own mask). They
do not decide the positional role; they show a head that joins subwords into words, which the
pooled share mixes with whatever the head does at the other kind of piece.

Indices: `layer` and `head` are 0-based, as in the model's tensors; word/token indices inside this
module are 0-based positions in the sentence.

Syntactic directions. For a dependency arc head -> dependent, "head->dep" means the query is the
head word and the head's attention should point at the dependent: nsubj "v->s" (the verb attends
to its subject), obj "v->o", amod "noun->adj", advmod "v->adv". "dep->head" is the reverse
(s->v, o->v, adj->noun, adv->v). The paper's names assume verbal/nominal heads; the arcs are
selected by relation only (UD puts the copula's subject under a noun or adjective: it counts).
One scored instance is one (query word, relation, direction); it is correct if the head's argmax
word is any word related to the query that way (a verb with two adverbs is one v->adv instance
with two acceptable answers). The baseline adds, for each instance, one count per acceptable
relative position; its accuracy is the top count over the instances, which is exactly the accuracy
of always answering that relative position.

Rare tokens. Sentences are eligible if their least frequent word is not among the `top_k` (500)
most frequent training words and they have at least 3 aligned words (with 2, "one of the two
rarest" always holds). Words are counted and looked up through one function, `frequency_words`
(headcount.parses.simple_tokenize, lowercased when the model's data are): the analysed words of a
sentence are that function's words, and a surface token handed in from elsewhere (a treebank's
"didn't", "U.S.", "--") is split by it before the lookup and is as frequent as its rarest part, so
no token is missing from the table only because of how it was split. Ties in frequency count as
equally rare: a hit on "the rarest" is any word of the minimum frequency, on "one of the two
rarest" any word whose frequency is at most the second smallest.
"""
