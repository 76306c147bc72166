"""dpledger.report"""
