"""One generate run: diffusers' modular pipeline on H3's workflows, with blocks of our own around each of
diffusers' (a stage per block), the run's state and residency, and what it reports."""
