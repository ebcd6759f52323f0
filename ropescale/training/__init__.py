"""ropescale.training"""
